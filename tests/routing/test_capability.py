"""Capability-aware routing: parameters a pool refuses send the request to a pool of its model that can serve it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from app.config import ConfigError, GatewayConfig, load_config, parse_config
from app.context import ClassDecision, RouteDecision
from app.errors import GatewayError
from app.routing.capability import refused_param, sets_param
from app.routing.pick import pick
from app.routing.state import ClusterState
from app.sim.testing import running_sim
from tests.conftest import running_gateway
from tests.routing.factory import PRICE, make_cluster, make_config, set_load

INTERACTIVE = ClassDecision("interactive", "stream")
BULK = ClassDecision("bulk", "n")
SPECULATIVE = {"speculative": True, "unsupported_params": ["min_p", "logit_bias", "top_k"]}


def route(cfg: GatewayConfig, cluster: ClusterState, decision: ClassDecision, body: dict[str, Any],
          exclude: frozenset[str] = frozenset()) -> RouteDecision:  # fmt: skip
    return pick(model=cfg.models[0], decision=decision, key=7, cluster=cluster, cfg=cfg.routing, exclude=exclude,
                body=body)  # fmt: skip


# -- what counts as setting a parameter --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "sets"),
    [
        ("min_p", 0.05, True), ("min_p", 0, False), ("min_p", 0.0, False), ("min_p", None, False),
        ("top_k", 20, True), ("top_k", 0, False), ("top_k", -1, False),
        ("logit_bias", {"42": -100}, True), ("logit_bias", {}, False),
        ("top_p", 0.9, True), ("top_p", 1, False),
        ("seed", 0, True),  # not in the neutral table: any non-null value counts
        ("top_k", True, True),  # a bool is not the number 1 (vLLM will refuse it; the pool must not see it)
    ],
)  # fmt: skip
def test_a_parameter_counts_as_set_only_when_it_changes_sampling(name: str, value: Any, sets: bool) -> None:
    assert sets_param({name: value}, name) is sets


def test_absent_parameter_is_not_set() -> None:
    assert not sets_param({"temperature": 0.5}, "min_p")


def test_refused_param_names_the_first_unsupported_parameter_the_body_sets() -> None:
    unsupported = ["min_p", "logit_bias", "top_k"]
    assert refused_param(unsupported, {"top_k": 5, "logit_bias": {"1": 2}}) == "logit_bias"
    assert refused_param(unsupported, {"min_p": 0, "top_k": -1, "temperature": 1}) is None
    assert refused_param([], {"min_p": 0.3}) is None


# -- config -----------------------------------------------------------------------------------------------


def _pool_cfg(**extra: Any) -> GatewayConfig:
    pool = {"role": "interactive", "served_model": "m", "replicas": ["http://127.0.0.1:9"], "price": PRICE, **extra}
    return parse_config({"models": [{"name": "m", "pools": ["p"]}], "pools": {"p": pool}})


def test_speculative_pool_defaults_to_the_parameters_vllm_refuses_with_speculative_decoding() -> None:
    assert _pool_cfg(speculative=True).pools["p"].unsupported_params == ["min_p", "logit_bias"]
    assert _pool_cfg().pools["p"].unsupported_params == []


def test_explicit_unsupported_params_replace_the_speculative_default() -> None:
    assert _pool_cfg(speculative=True, unsupported_params=[]).pools["p"].unsupported_params == []
    assert _pool_cfg(unsupported_params=["top_k"]).pools["p"].unsupported_params == ["top_k"]


def test_unsupported_param_must_be_a_field_name() -> None:
    with pytest.raises(ConfigError, match=r"pools\.p\.unsupported_params\[0\]"):
        _pool_cfg(unsupported_params=["min p"])


def test_embedded_local_config_keeps_top_k_off_the_speculative_pool() -> None:
    # Its speculation (min_p, logit_bias) is read from the server's /metrics; top_k is what nothing published says.
    fast = load_config(None).pools["fast"]
    assert "speculative" not in fast.model_fields_set and fast.unsupported_params == ["top_k"]


# -- pick -------------------------------------------------------------------------------------------------


def test_interactive_request_with_a_refused_parameter_goes_to_the_pool_that_can_serve_it() -> None:
    cfg = make_config(fast_extra=SPECULATIVE)
    got = route(cfg, make_cluster(cfg), INTERACTIVE, {"min_p": 0.1})
    assert (got.pool, got.reason, got.spilled) == ("bulk", "capability:min_p", False)
    assert got.detail == "fast cannot serve min_p"


def test_request_without_refused_parameters_keeps_its_home_pool() -> None:
    cfg = make_config(fast_extra=SPECULATIVE)
    got = route(cfg, make_cluster(cfg), INTERACTIVE, {"temperature": 0.7, "top_k": -1, "min_p": 0})
    assert got.pool == "fast" and not got.reason.startswith("capability")


def test_bulk_request_never_borrows_a_pool_that_refuses_its_parameters() -> None:
    cfg = make_config(fast_extra=SPECULATIVE, routing={"bulk_borrow_below_utilization": 1.0})
    cluster = make_cluster(cfg)
    for r in cluster.pools["bulk"].replicas:
        set_load(r, running=8, waiting=5, kv=0.9)
    assert route(cfg, cluster, BULK, {}).pool == "fast"  # saturated bulk borrows the idle fast pool …
    got = route(cfg, cluster, BULK, {"top_k": 40})
    assert got.pool == "bulk"  # … but not with a parameter fast cannot serve


def test_no_failover_into_a_pool_that_refuses_the_parameters() -> None:
    cfg = make_config(fast_extra=SPECULATIVE)
    cluster = make_cluster(cfg)
    bulk_only = frozenset(r.url for r in cluster.pools["bulk"].replicas)
    with pytest.raises(GatewayError) as err:
        route(cfg, cluster, INTERACTIVE, {"logit_bias": {"5": 1}}, exclude=bulk_only)
    assert err.value.status == 503
    assert route(cfg, cluster, INTERACTIVE, {}, exclude=bulk_only).pool == "fast"


def test_capability_reroute_keeps_its_reason_on_a_failover_attempt() -> None:
    cfg = make_config(fast_extra=SPECULATIVE, bulk=["http://127.0.0.1:9201", "http://127.0.0.1:9202"])
    cluster = make_cluster(cfg)
    first = route(cfg, cluster, INTERACTIVE, {"top_k": 3})
    again = route(cfg, cluster, INTERACTIVE, {"top_k": 3}, exclude=frozenset({first.replica}))
    assert (again.pool, again.reason, again.attempt) == ("bulk", "capability:top_k", 2)
    assert again.replica != first.replica


def test_no_pool_can_serve_the_parameters_is_a_400_naming_each_refusal() -> None:
    cfg = make_config(fast_extra=SPECULATIVE, bulk_extra={"unsupported_params": ["min_p"]})
    with pytest.raises(GatewayError) as err:
        route(cfg, make_cluster(cfg), INTERACTIVE, {"min_p": 0.2})
    e = err.value
    assert (e.status, e.param, e.code) == (400, "min_p", "unsupported_parameter")
    assert "pool fast cannot serve 'min_p'" in e.message and "pool bulk cannot serve 'min_p'" in e.message
    # a body the bulk pool can serve still goes there
    assert route(cfg, make_cluster(cfg), INTERACTIVE, {"top_k": 2}).pool == "bulk"


def test_single_pool_model_refusing_a_parameter_answers_400() -> None:
    cfg = make_config(bulk=[], fast_extra=SPECULATIVE)
    with pytest.raises(GatewayError) as err:
        route(cfg, make_cluster(cfg), BULK, {"top_k": 10})
    assert err.value.status == 400 and err.value.param == "top_k"


def test_without_a_body_pick_ignores_capabilities() -> None:
    cfg = make_config(fast_extra=SPECULATIVE)
    got = pick(model=cfg.models[0], decision=INTERACTIVE, key=7, cluster=make_cluster(cfg), cfg=cfg.routing)
    assert got.pool == "fast"


# -- through the gateway ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_pools() -> Iterator[str]:
    """A gateway with a speculative `fast` pool that refuses min_p/logit_bias/top_k and a `bulk` pool, on sims."""
    price = {"input_per_m": 1.0, "cached_input_per_m": 0.1, "output_per_m": 2.0}
    with running_sim(model="served-model") as fast, running_sim(model="served-model") as bulk:
        cfg = parse_config(
            {
                "models": [{"name": "m", "pools": ["fast", "bulk"]}],
                "pools": {
                    "fast": {"role": "interactive", "served_model": "served-model", "replicas": [fast],
                             "price": price, **SPECULATIVE},
                    "bulk": {"role": "bulk", "served_model": "served-model", "replicas": [bulk], "price": price},
                },
                "auth": {"required": False},
                "routing": {"allow_spill": False},
            },
        )  # fmt: skip
        with running_gateway(cfg) as gw:
            yield gw


def test_gateway_sends_a_refused_parameter_to_the_capable_pool_and_says_why(two_pools: str) -> None:
    client = openai.OpenAI(base_url=two_pools + "/v1", api_key="EMPTY", max_retries=0)
    msgs: list[Any] = [{"role": "user", "content": "hi"}]
    plain = client.chat.completions.with_raw_response.create(model="m", messages=msgs, max_tokens=4)
    assert "pool=fast;" in plain.headers["x-kvgate-route"]
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=msgs, max_tokens=4, extra_body={"top_k": 20}
    )
    assert raw.parse().choices[0].message.content is not None
    route_header = raw.headers["x-kvgate-route"]
    assert "pool=bulk;" in route_header and "pick=capability:top_k;" in route_header


def test_gateway_answers_400_when_no_pool_of_the_model_can_serve_the_parameters() -> None:
    price = {"input_per_m": 1.0, "output_per_m": 2.0}
    with running_sim(model="served-model") as fast:
        cfg = parse_config(
            {"models": [{"name": "m", "pools": ["fast"]}],
             "pools": {"fast": {"role": "interactive", "served_model": "served-model", "replicas": [fast],
                                "price": price, "speculative": True}},
             "auth": {"required": False}},
        )  # fmt: skip
        with running_gateway(cfg) as gw:
            client = openai.OpenAI(base_url=gw + "/v1", api_key="EMPTY", max_retries=0)
            ok = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                                extra_body={"min_p": 0})  # fmt: skip
            assert ok.choices
            with pytest.raises(openai.BadRequestError) as err:
                client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                               extra_body={"min_p": 0.1})  # fmt: skip
    assert err.value.code == "unsupported_parameter" and err.value.param == "min_p"
