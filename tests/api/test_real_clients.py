"""What Claude Code, Codex, opencode and Qwen Code really send (tests/fixtures/agents, captured by
experiments/agents_lab) is accepted through the gateway as vLLM accepts it; a body the gateway refuses is worded so
Claude Code falls back, and leaves one log line without prompt text."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.sim.testing import running_sim
from app.surfaces import MESSAGES
from app.surfaces.messages.to_chat import chat_messages
from tests.conftest import PUBLIC_MODEL, gateway_config, running_gateway

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "agents"
TENANTS = [{"id": "lab-off", "api_keys": ["sk-off"], "normalize": "off"},
           {"id": "lab-on", "api_keys": ["sk-on"], "normalize": "on"}]
SKIP_HEADERS = {"x-api-key", "authorization", "accept-encoding", "connection", "host", "content-length"}


def captured(client: str) -> list[dict[str, Any]]:
    """The client's captured generation requests (and count_tokens), in the order it sent them."""
    path = FIXTURES / f"{client}.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return [r for r in recs if r["method"] == "POST" and isinstance(r.get("body"), dict)]


@pytest.fixture(scope="module")
def gateway() -> Iterator[str]:
    """One sim with a long context behind a gateway with a normalize-off and a normalize-on tenant."""
    with running_sim(model="served-model", max_model_len=131072, time_scale=1000.0,
                     enable_auto_tool_choice=True, tool_call_parser="hermes") as sim:
        cfg = gateway_config([sim], tenants=TENANTS, auth={"required": True},
                             upstream={"read_timeout_s": 30, "max_body_bytes": 8 * 1024 * 1024})
        with running_gateway(cfg) as gw:
            yield gw


def replay(gw: str, rec: dict[str, Any], key: str) -> httpx.Response:
    """The captured request as the client sent it (its headers, query and body), with the gateway's model name."""
    headers = {k: v for k, v in rec["headers"].items() if k.lower() not in SKIP_HEADERS}
    headers["x-api-key" if rec["api"] == "messages" else "authorization"] = (
        key if rec["api"] == "messages" else f"Bearer {key}"
    )
    url = gw + rec["path"] + (f"?{rec['query']}" if rec["query"] else "")
    return httpx.post(url, json={**rec["body"], "model": PUBLIC_MODEL}, headers=headers, timeout=30)


def one_of_each_kind(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last request of each kind (turn-open, tool-result, other): the longest of each shape."""
    return list({r["kind"]: r for r in recs}.values())


@pytest.mark.parametrize("client", ["claude", "codex", "opencode", "qwen"])
@pytest.mark.parametrize("key", ["sk-off", "sk-on"])
def test_a_real_clients_request_of_each_kind_is_answered_200(gateway: str, client: str, key: str) -> None:
    recs = one_of_each_kind(captured(client))
    if not recs:
        pytest.skip(f"no capture of {client} in {FIXTURES}")
    statuses = [(r["seq"], r["kind"], replay(gateway, r, key).status_code) for r in recs]
    assert [s for s in statuses if s[2] != 200] == [], statuses


@pytest.mark.slow
@pytest.mark.parametrize("client", ["claude", "codex", "opencode", "qwen"])
@pytest.mark.parametrize("key", ["sk-off", "sk-on"])
def test_every_captured_request_of_a_real_client_is_answered_200(gateway: str, client: str, key: str) -> None:
    recs = captured(client)
    if not recs:
        pytest.skip(f"no capture of {client} in {FIXTURES}")
    statuses = [(r["seq"], replay(gateway, r, key).status_code) for r in recs]
    assert [s for s in statuses if s[1] != 200] == [], statuses


def test_claude_codes_mid_conversation_system_turn_is_accepted_and_stays_history() -> None:
    body = next(r["body"] for r in captured("claude") if r["kind"] == "tool-result")
    assert any(m["role"] == "system" for m in body["messages"][1:]), "the capture has the inline system turn"
    MESSAGES.validate(body)
    view = MESSAGES.view(body)
    inline = next(i for i, m in enumerate(body["messages"]) if m["role"] == "system")
    assert all(slot.turn != inline for slot in view.head), "a system turn after the first user turn is history"
    chat = chat_messages(body)
    assert [m["role"] for m in chat[:3]] == ["system", "user", "system"]


def test_a_leading_system_turn_in_messages_is_part_of_the_prefix() -> None:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "system", "content": "You are terse."},
                                                         {"role": "user", "content": "hi"}]}
    view = MESSAGES.view(body)
    assert [s.text for s in view.head] == ["You are terse.", "hi"]
    warm = MESSAGES.warm_request(body, 10_000)
    assert warm is not None and [m["role"] for m in warm.body["messages"]] == ["system", "user"]


def test_a_billing_only_system_turn_is_left_out_of_the_continuation_as_vllm_does() -> None:
    body = {"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1;"}]},
        {"role": "system", "content": [{"type": "text", "text": "Agents: a"}, {"type": "text", "text": ", b"}]},
    ]}
    assert chat_messages(body) == [{"role": "user", "content": "hi"}, {"role": "system", "content": "Agents: a, b"}]


def test_an_unknown_role_is_a_400_worded_so_claude_code_falls_back_and_logged_once_without_prompt_text(
    gateway: str, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "the prompt text that must not be logged"
    with caplog.at_level(logging.INFO, logger="kvgate.rejected"):
        r = httpx.post(gateway + "/v1/messages?beta=true", headers={"x-api-key": "sk-on"}, json={
            "model": PUBLIC_MODEL, "max_tokens": 8,
            "messages": [{"role": "user", "content": secret}, {"role": "developer", "content": secret}]})
    assert r.status_code == 400
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    # Claude Code's fallback to its older prompt shape matches these two phrases.
    assert "Unexpected role" in err["error"]["message"] and "input message role" in err["error"]["message"]
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "kvgate.rejected"]
    assert lines == ["rejected path=/v1/messages status=400 error=invalid_request_error tenant=lab-on"]
    assert secret not in caplog.text


def test_a_refusal_after_authentication_is_logged_with_its_tenant_and_reason(
    gateway: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="kvgate.rejected"):
        r = httpx.post(gateway + "/v1/messages", headers={"x-api-key": "sk-wrong"},
                       json={"model": PUBLIC_MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 401
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "kvgate.rejected"]
    assert len(lines) == 1 and lines[0].startswith("rejected path=/v1/messages status=401 error=")
    assert lines[0].endswith("tenant=-")
