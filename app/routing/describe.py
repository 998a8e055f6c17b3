"""How a routing decision is shown: the x-kvgate-route header, span attributes, metric attributes."""

from __future__ import annotations

from app.context import ClassDecision, RouteDecision

ROUTE_HEADER = "x-kvgate-route"


def route_header(cls: ClassDecision, route: RouteDecision | None = None) -> str:
    """`interactive;rule=stream;pool=fast;policy=prefix_affinity;reason=prefix_home[;spilled][;attempt=2]`.

    Replica URLs stay out of the header: they are internal addresses (the span carries them).
    """
    parts = [cls.route_class, f"rule={cls.reason}"]
    if route is not None:
        parts += [f"pool={route.pool}", f"policy={route.policy}", f"reason={route.reason}"]
        if route.spilled:
            parts.append("spilled")
        if route.attempt > 1:
            parts.append(f"attempt={route.attempt}")
    return ";".join(parts)


def span_attributes(cls: ClassDecision, route: RouteDecision | None = None) -> dict[str, str | int | bool]:
    """Attributes for the request span: class and its rule, chosen replica and runner-up, why."""
    attrs: dict[str, str | int | bool] = {
        "kvgate.route.class": cls.route_class,
        "kvgate.route.class_rule": cls.reason,
    }
    if route is None:
        return attrs
    attrs.update(
        {
            "kvgate.route.pool": route.pool,
            "kvgate.route.replica": route.replica,
            "kvgate.route.policy": route.policy,
            "kvgate.route.reason": route.reason,
            "kvgate.route.spilled": route.spilled,
            "kvgate.route.attempt": route.attempt,
        }
    )
    if route.runner_up is not None:
        attrs["kvgate.route.runner_up"] = route.runner_up
    if route.priority is not None:
        attrs["kvgate.route.priority"] = route.priority
    detail = getattr(route, "detail", "")
    if detail:
        attrs["kvgate.route.detail"] = detail
    return attrs


def decision_attributes(cls: ClassDecision, route: RouteDecision) -> dict[str, str]:
    """Attributes of one `gateway.route.decisions` increment: {pool, class, policy, reason}."""
    return {"pool": route.pool, "class": cls.route_class, "policy": route.policy, "reason": route.reason}
