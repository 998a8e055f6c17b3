"""One long stream per API (chat, Responses, Messages) read to its end and classified: for routing_faults.py.

Each reader sends a body that asks for exactly `max_tokens` tokens (ignore_eos) and checks, from the raw SSE
events, that the client read one uninterrupted answer: one identity (chat id; Responses response and item
id, consecutive sequence numbers; Messages message id and one text block), one opening, the length finish,
the final text equal to the deltas (Responses' response.completed, which states the whole text), and usage
counting the tokens asked for. Usage alone cannot show a duplicated or missing delta (the continuation is
capped at what was left, so the sum is right either way): every request is seeded, and on sims, where a seeded
request continues its own text, `whole_text` asks the same request again unstreamed to compare the texts.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

APIS = ("chat", "responses", "messages")
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
LENGTH = {"chat": "length", "responses": "incomplete", "messages": "max_tokens"}


@dataclass
class StreamOutcome:
    """How one stream ended, and what identity, openings and finishes the client saw."""

    first_token: bool = False
    chunks: int = 0
    error: str | None = None
    error_then_end: bool = False  # the error event, then the stream's clean end ([DONE], or the body's end)
    done: bool = False
    transport_error: str | None = None
    ids: set[str] = field(default_factory=set)
    openings: int = 0  # chat role chunks, Responses response.created + item added, Messages block starts
    finishes: list[str] = field(default_factory=list)
    completion_tokens: int | None = None
    deltas: list[str] = field(default_factory=list)
    final_text: str | None = None
    seq: list[int] = field(default_factory=list)
    same_text: bool | None = None  # the streamed text equals the same request answered whole (sims only)

    def whole(self, api: str, max_tokens: int) -> bool:
        """One answer to the client: one identity and opening, the length finish, every token, text that adds up."""
        openings = 2 if api == "responses" else 1  # response.created + output_item.added
        text_ok = self.final_text is None or self.final_text == "".join(self.deltas)
        seq_ok = self.seq == list(range(len(self.seq)))
        return (self.done and self.error is None and len(self.ids) == 1 and self.openings == openings
                and self.finishes == [LENGTH[api]] and self.completion_tokens == max_tokens and text_ok
                and seq_ok)


def request_body(api: str, model: str, i: int, max_tokens: int, greedy: bool = False) -> dict[str, Any]:
    """A long free-form story request, different per stream (`greedy`: temperature 0, for vLLM's text check)."""
    prompt = (f"Stream number {i:03d}: write a long story about replica failover, retries and circuit breakers. "
              f"Seed {i * 7919}.")
    if api == "responses":
        return {"model": model, "stream": True, "max_output_tokens": max_tokens, "ignore_eos": True, "seed": i,
                "input": prompt}
    body: dict[str, Any] = {"model": model, "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
                            "seed": i, "messages": [{"role": "user", "content": prompt}]}
    if api == "chat":
        body["stream_options"] = {"include_usage": True}
    if greedy:
        body["temperature"] = 0
    return body


def _chat(doc: dict[str, Any], out: StreamOutcome) -> bool:
    if "error" in doc:
        out.error = str(doc["error"].get("message", ""))[:120]
        return False
    out.ids.add(doc.get("id"))
    produced = False
    for ch in doc.get("choices") or ():
        delta = ch.get("delta") or {}
        out.openings += bool(delta.get("role"))
        if delta.get("content"):
            out.deltas.append(delta["content"])
            produced = True
        if ch.get("finish_reason"):
            out.finishes.append(ch["finish_reason"])
    if doc.get("usage"):
        out.completion_tokens = doc["usage"].get("completion_tokens")
    return produced


def _responses(name: str, doc: dict[str, Any], out: StreamOutcome) -> bool:
    out.seq.append(doc.get("sequence_number", -1))
    if name == "error":
        out.error = str(doc.get("message", ""))[:120]
    elif name in ("response.created", "response.output_item.added"):
        out.openings += 1
        if name == "response.created":
            out.ids.add(doc["response"]["id"])
    elif name == "response.output_text.delta":
        out.deltas.append(doc["delta"])
        return True
    elif name in ("response.completed", "response.incomplete", "response.failed"):
        response = doc["response"]
        out.done = True
        out.ids.add(response["id"])
        out.finishes.append(response["status"])
        out.completion_tokens = (response.get("usage") or {}).get("output_tokens")
        out.final_text = "".join(c.get("text", "") for item in response.get("output") or ()
                                 for c in item.get("content") or ())
    return False


def _messages(name: str, doc: dict[str, Any], out: StreamOutcome) -> bool:
    if name == "error":
        out.error = str(doc.get("error", {}).get("message", ""))[:120]
    elif name == "message_start":
        out.ids.add(doc["message"]["id"])
    elif name == "content_block_start":
        out.openings += 1
    elif name == "content_block_delta" and doc["delta"].get("type") == "text_delta":
        out.deltas.append(doc["delta"]["text"])
        return True
    elif name == "message_delta":
        out.finishes.append(doc["delta"].get("stop_reason"))
        out.completion_tokens = (doc.get("usage") or {}).get("output_tokens")
    elif name == "message_stop":
        out.done = True
    return False


def _event(api: str, event: bytes, out: StreamOutcome) -> bool:
    """Account one SSE event; True when it carried generated text."""
    name, data = "", b""
    for line in event.split(b"\n"):
        if line.startswith(b"event:"):
            name = line[6:].strip().decode()
        elif line.startswith(b"data:"):
            data = line[5:].strip()
    if not data:
        return False
    if api == "chat":
        if data == b"[DONE]":
            out.done = True
            out.error_then_end = out.error is not None
            return False
        return _chat(orjson.loads(data), out)
    doc = orjson.loads(data)
    return _responses(name, doc, out) if api == "responses" else _messages(name, doc, out)


async def one_stream(session: aiohttp.ClientSession, url: str, api: str, model: str, i: int, max_tokens: int,
                     out: StreamOutcome, first: asyncio.Event, n_started: list[int], n_total: int,
                     greedy: bool = False) -> None:
    """Read one stream to its end and classify how it ended; `first` is set once all n_total have text."""
    buf = b""
    try:
        async with session.post(url + PATHS[api], json=request_body(api, model, i, max_tokens, greedy)) as resp:
            if resp.status != 200:
                out.transport_error = f"HTTP {resp.status}"
                return
            async for chunk in resp.content.iter_any():
                buf += chunk
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    produced = _event(api, event, out)
                    out.chunks += produced
                    if produced and not out.first_token:
                        out.first_token = True
                        n_started[0] += 1
                        if n_started[0] >= n_total:
                            first.set()
        if api != "chat" and out.error is not None:
            out.error_then_end = True  # these APIs end with the error event itself, no [DONE]
    except (aiohttp.ClientError, TimeoutError) as err:
        out.transport_error = type(err).__name__


async def whole_text(session: aiohttp.ClientSession, url: str, api: str, model: str, i: int, max_tokens: int) -> str:
    """The text of stream i's request answered whole (not streamed)."""
    body = {**request_body(api, model, i, max_tokens), "stream": False}
    body.pop("stream_options", None)
    async with session.post(url + PATHS[api], json=body) as resp:
        doc = orjson.loads(await resp.read())
    if api == "chat":
        return str(doc["choices"][0]["message"]["content"])
    if api == "responses":
        return "".join(c.get("text", "") for item in doc["output"] for c in item.get("content") or ())
    return "".join(b.get("text", "") for b in doc["content"] if b.get("type") == "text")
