"""The opt-in step trace: each request's step and first token, each step's modeled and wall time; off = 404."""

from __future__ import annotations

import httpx

from app.sim.testing import running_sim

BODY = {"model": "sim", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "ignore_eos": True}


def test_a_traced_request_names_its_prefill_step_and_first_token_after_it_arrived() -> None:
    with running_sim(model="sim", time_scale=50.0, profile="h100-8b", step_trace=True) as base:
        r = httpx.post(base + "/v1/chat/completions", json=BODY, headers={"x-request-id": "light-1"}, timeout=10)
        assert r.status_code == 200
        trace = httpx.get(base + "/sim/step_trace", timeout=10).json()
    (req,) = [q for q in trace["requests"] if q["rid"] == "light-1"]
    assert req["arrival"] <= req["enqueued"] <= req["scheduled"] <= req["first_token"]
    assert req["step"] == req["first_step"]  # a short prompt: one prefill step, its first token at its end
    steps = {s[0]: dict(zip(trace["step_columns"], s, strict=True)) for s in trace["steps"]}
    prefill = steps[req["step"]]
    assert prefill["prefills"] == 1 and prefill["prefill_tokens"] == r.json()["usage"]["prompt_tokens"]
    assert prefill["modeled_s"] > 0 and prefill["ended_at"] >= prefill["start"]
    assert len(steps) == 4  # one prefill, three decodes
    assert trace["time_scale"] == 50.0


def test_without_the_flag_there_is_no_trace() -> None:
    with running_sim(model="sim", time_scale=50.0, profile="h100-8b") as base:
        assert httpx.get(base + "/sim/step_trace", timeout=10).status_code == 404
