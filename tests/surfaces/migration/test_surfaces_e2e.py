"""Responses and Messages streams on a SIGKILLed replica continue on the survivor, read through the official SDKs.

Two `kvgate sim` processes behind the gateway (round robin, so two of four streams are on the victim); the
victim is killed once every stream has text. The SDKs' own stream accumulators (openai's responses.stream,
anthropic's messages.stream) rebuild the response from the events, so a repeated created/added event, a
foreign item id or a jump in the numbering would break them. Every stream is seeded, and a seeded sim
continues its own text (app/sim/engine.py, sequence_plan): the spliced text must equal the same request's
text answered whole afterwards, so a duplicated or missing delta shows; usage must count the tokens asked for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.routing.test_faults_e2e import MODEL, SimProcess

pytestmark = pytest.mark.slow

TOKENS = 400
Cluster = tuple[str, SimProcess, SimProcess]


async def _responses_stream(gw: str, i: int, has_text: Callable[[], None]) -> dict[str, Any]:
    client = openai.AsyncOpenAI(base_url=gw + "/v1", api_key="EMPTY", max_retries=0, timeout=30)
    seen: dict[str, Any] = {"types": [], "seq": [], "deltas": [], "item_ids": set()}
    async with client.responses.stream(model=MODEL, input=f"stream {i}", max_output_tokens=TOKENS,
                                       extra_body={"ignore_eos": True, "seed": i}) as stream:
        async for event in stream:
            seen["types"].append(event.type)
            seen["seq"].append(event.sequence_number)
            if event.type == "response.output_text.delta":
                if not seen["deltas"]:
                    has_text()
                seen["deltas"].append(event.delta)
                seen["item_ids"].add(event.item_id)
        # The SDK yields a stream's error event and ends (no response.completed to accumulate).
        seen["final"] = await stream.get_final_response() if "error" not in seen["types"] else None
    await client.close()
    return seen


async def _messages_stream(gw: str, i: int, has_text: Callable[[], None]) -> dict[str, Any]:
    client = anthropic.AsyncAnthropic(base_url=gw, api_key="EMPTY", max_retries=0, timeout=30)
    seen: dict[str, Any] = {"types": [], "deltas": [], "indexes": set()}
    messages = [{"role": "user", "content": f"stream {i}"}]
    async with client.messages.stream(model=MODEL, max_tokens=TOKENS, messages=messages,  # type: ignore[arg-type]
                                      extra_body={"ignore_eos": True, "seed": i}) as stream:
        async for event in stream:
            seen["types"].append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                if not seen["deltas"]:
                    has_text()
                seen["deltas"].append(event.delta.text)
                seen["indexes"].add(event.index)
        seen["final"] = await stream.get_final_message()
    await client.close()
    return seen


async def _whole_texts(gw: str, api: str) -> list[str]:
    """The same four requests answered whole (not streamed) by the survivor: what each stream must have read."""
    # Concurrently: a seeded sim's text depends on the seed, not on the batch it decodes in (one at a time took
    # 11 s of each test's 13).
    if api == "responses":
        oa = openai.AsyncOpenAI(base_url=gw + "/v1", api_key="EMPTY", max_retries=0, timeout=30)

        async def response(i: int) -> str:
            return (await oa.responses.create(model=MODEL, input=f"stream {i}", max_output_tokens=TOKENS,
                                              extra_body={"ignore_eos": True, "seed": i})).output_text

        texts = await asyncio.gather(*(response(i) for i in range(4)))
        await oa.close()
        return list(texts)
    an = anthropic.AsyncAnthropic(base_url=gw, api_key="EMPTY", max_retries=0, timeout=30)

    async def message(i: int) -> str:
        msg = await an.messages.create(model=MODEL, max_tokens=TOKENS, messages=[{"role": "user", "content":
                                       f"stream {i}"}], extra_body={"ignore_eos": True, "seed": i})
        return "".join(b.text for b in msg.content if b.type == "text")

    texts = await asyncio.gather(*(message(i) for i in range(4)))
    await an.close()
    return list(texts)


async def _kill_midway(sims: Cluster, one: Callable[[str, int, Callable[[], None]], Awaitable[dict[str, Any]]]
                       ) -> tuple[list[dict[str, Any]], str]:
    gw, _, victim = sims
    started = asyncio.Event()
    count = [0]

    def has_text() -> None:
        count[0] += 1
        if count[0] == 4:
            started.set()

    tasks = [asyncio.create_task(one(gw, i, has_text)) for i in range(4)]
    await asyncio.wait_for(started.wait(), 10)
    await asyncio.to_thread(victim.kill)
    results = await asyncio.gather(*tasks)
    async with httpx.AsyncClient() as http:
        metrics = (await http.get(gw + "/metrics")).text
    return results, metrics


async def test_responses_streams_on_a_killed_replica_read_as_one_response_each(cluster: Cluster) -> None:
    results, metrics = await _kill_midway(cluster, _responses_stream)
    assert ["".join(seen["deltas"]) for seen in results] == await _whole_texts(cluster[0], "responses")
    for seen in results:
        assert "error" not in seen["types"]
        assert seen["types"].count("response.created") == 1 and seen["types"].count("response.output_item.added") == 1
        assert seen["seq"] == list(range(len(seen["seq"])))
        final = seen["final"]
        assert len(seen["item_ids"]) == 1 and [item.id for item in final.output] == list(seen["item_ids"])
        assert final.output_text == "".join(seen["deltas"])
        assert final.usage.output_tokens == TOKENS  # every token asked for, none twice
    assert 'gateway_stream_migrations_total{outcome="migrated",pool="main"} 2.0' in metrics
    # No replica stores a migrated response whole: GET and previous_response_id say so; the others still work.
    async with httpx.AsyncClient(base_url=cluster[0]) as http:
        stored = [await http.get(f"/v1/responses/{seen['final'].id}") for seen in results]
        moved = next(seen["final"].id for seen, r in zip(results, stored, strict=True) if r.status_code == 404)
        follow = await http.post("/v1/responses", json={"model": MODEL, "input": "next", "max_output_tokens": 4,
                                                        "previous_response_id": moved})
    assert sorted(r.status_code for r in stored) == [200, 200, 404, 404], [r.text for r in stored]
    for r in (*(r for r in stored if r.status_code == 404), follow):
        assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_stored"


async def test_messages_streams_on_a_killed_replica_read_as_one_message_each(cluster: Cluster) -> None:
    results, metrics = await _kill_midway(cluster, _messages_stream)
    assert ["".join(seen["deltas"]) for seen in results] == await _whole_texts(cluster[0], "messages")
    for seen in results:
        assert seen["types"].count("message_start") == 1 and seen["types"].count("content_block_start") == 1
        assert seen["types"][-2:] == ["message_delta", "message_stop"] and seen["indexes"] == {0}
        final = seen["final"]
        assert len(final.content) == 1 and final.content[0].text == "".join(seen["deltas"])
        assert final.stop_reason == "max_tokens" and final.usage.output_tokens == TOKENS
    assert 'gateway_stream_migrations_total{outcome="migrated",pool="main"} 2.0' in metrics


@pytest.mark.parametrize("cluster", [0], indirect=True)
async def test_without_migration_both_apis_end_a_cut_stream_with_their_error_event(cluster: Cluster) -> None:
    responses, _ = await _kill_midway(cluster, _responses_stream)
    assert [seen["types"][-1] == "error" for seen in responses].count(True) == 2
    await asyncio.to_thread(cluster[2].start)
    await asyncio.sleep(1.5)  # probed healthy again, back in the rotation
    messages, _ = await _kill_midway(cluster, _expect_error(_messages_stream))
    assert sum(isinstance(seen.get("error"), anthropic.APIStatusError) for seen in messages) == 2


def _expect_error(one: Callable[[str, int, Callable[[], None]], Awaitable[dict[str, Any]]]
                  ) -> Callable[[str, int, Callable[[], None]], Awaitable[dict[str, Any]]]:
    async def run(gw: str, i: int, has_text: Callable[[], None]) -> dict[str, Any]:
        try:
            return await one(gw, i, has_text)
        except anthropic.APIError as err:  # the SDK raises a stream's error event
            return {"error": err}

    return run
