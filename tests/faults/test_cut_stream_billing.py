"""A stream the client abandons is billed for what it was sent: a Messages stream left after 100 deltas bills the
same output as a chat stream left after 100 content chunks (before: message_start's usage marked the stream
"reported", and the abandoned Messages stream was billed 0 output tokens)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson

from app.sim.testing import running_sim
from tests.conftest import gateway_config, running_gateway
from tests.faults.helpers import chat, messages

DELTAS = 100
ADMIN = "sk-admin-test"
TENANTS = [{"id": "chatter", "api_keys": ["sk-chatter"]}, {"id": "messenger", "api_keys": ["sk-messenger"]}]


async def abandon_after(http: httpx.AsyncClient, path: str, body: dict[str, Any], key: str) -> int:
    """Read the stream until DELTAS content events arrived, then drop the connection; the events counted."""
    seen = 0
    async with http.stream("POST", path, json=body, headers={"authorization": f"Bearer {key}"}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            token_chunk = line.startswith("data: {") and '"content":"' in line and '"content":""' not in line
            if line == "event: content_block_delta" or token_chunk:
                seen += 1
                if seen == DELTAS:
                    break
    return seen


async def billed_output(http: httpx.AsyncClient, tenant: str) -> int:
    """The tenant's output tokens in the store, once its one request was settled."""
    for _ in range(200):
        doc = orjson.loads((await http.get(f"/admin/tenants/{tenant}/usage?days=1",
                                           headers={"authorization": f"Bearer {ADMIN}"})).content)
        total = doc["total"]
        if total["requests"] == 1:
            return int(total["tokens"]["output"])
        await asyncio.sleep(0.05)
    raise AssertionError(f"{tenant}'s request was never settled")


async def test_an_abandoned_messages_stream_bills_its_delivered_output_like_chat() -> None:
    with running_sim(model="served-model", time_scale=1) as sim:
        cfg = gateway_config([sim], tenants=TENANTS, auth={"required": True, "admin_keys": [ADMIN]})
        with running_gateway(cfg) as gw:
            async with httpx.AsyncClient(base_url=gw, timeout=60) as http:
                long = {"max_tokens": 2000, "stream": True, "ignore_eos": True}
                got_chat = await abandon_after(http, "/v1/chat/completions", chat("go on", **long), "sk-chatter")
                got_msgs = await abandon_after(http, "/v1/messages", messages("go on", **long), "sk-messenger")
                assert got_chat == got_msgs == DELTAS
                chat_billed = await billed_output(http, "chatter")
                msgs_billed = await billed_output(http, "messenger")
    print(f"abandoned after {DELTAS} deltas: chat billed {chat_billed} output tokens, Messages {msgs_billed}")
    assert chat_billed >= DELTAS
    assert abs(msgs_billed - chat_billed) <= 0.05 * chat_billed, (msgs_billed, chat_billed)
