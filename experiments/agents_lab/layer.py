"""The lab's scripted layer: between a real coding client and its upstream (`kvgate sim`, or kvgate over sims).

It captures every request (method, path, query, headers with keys redacted, body) to a JSONL file, forwards it
unchanged, reads the upstream's answer to the end (usage, status, x-kvgate-* headers) and answers the client
with a *scripted* reply in the same wire format, carrying the upstream's usage:

- the first request of a user turn (tools offered, the newest input is the user's text, and that text holds a
  `lab-run: <shell command>` line) gets a tool call of the client's shell tool running that command — Messages
  `tool_use`, Responses `function_call`, chat `tool_calls`, streamed or not, as the request asked;
- every other request (the follow-up carrying the tool's result, a title request, ...) gets a fixed text.

So the sim never has to call tools, the client runs a real tool and sends its real output, and every arm sees the
same conversation (the replies do not depend on the sim's random text). A non-200 from the upstream reaches the
client unchanged, so its fallbacks (or its failure) are what they would be against that upstream.

    python experiments/agents_lab/layer.py --port P --upstream http://127.0.0.1:Q --capture FILE
    POST /_lab/label {"arm": ..., "client": ..., "session": ..., "turn": ...}   labels for the next requests

With --passthrough it is a tap in front of one replica (session_routing.py): it records and relays as is.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

REDACT = {"authorization", "x-api-key", "api-key", "cookie"}
HOP = {"host", "content-length", "transfer-encoding", "connection", "accept-encoding", "keep-alive"}
RUN_RE = re.compile(r"lab-run:\s*([^\"\n]+)")  # opencode quotes a prompt that has a newline
SHELL_TOOLS = ("bash", "shell", "exec_command", "shell_command", "run_shell_command", "local_shell")
REPLY = "Done. The output above is what the command printed."


def _sse(event: str | None, obj: Any) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                out.append(part["text"])
        return "\n".join(out)
    return ""


def turn_command(api: str, body: dict[str, Any]) -> str | None:
    """The `lab-run:` command when this request opens a user turn (the newest input is the user's text)."""
    if not body.get("tools"):
        return None
    if api == "responses":
        items = body.get("input")
        if not isinstance(items, list) or not items:
            return None
        last = items[-1]
        if not isinstance(last, dict) or last.get("type", "message") != "message" or last.get("role") != "user":
            return None
        text = _text_of(last.get("content"))
    else:
        msgs = body.get("messages") or []
        users = [m for m in msgs if isinstance(m, dict) and m.get("role") in ("user", "assistant", "tool")]
        if not users or users[-1].get("role") != "user":
            return None
        content = users[-1].get("content")
        if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            return None
        text = _text_of(content)
    found = RUN_RE.findall(text)
    return found[-1].strip() if found else None


def _tool_spec(api: str, tool: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(name, JSON schema) of a tool in any of the three APIs' formats."""
    if api == "messages":
        return str(tool.get("name", "")), tool.get("input_schema") or {}
    fn = tool.get("function") if api == "chat" else tool
    fn = fn if isinstance(fn, dict) else {}
    return str(fn.get("name", "")), fn.get("parameters") or {}


def shell_call(api: str, tools: list[Any], command: str) -> tuple[str, dict[str, Any]] | None:
    """(tool name, arguments) running `command` with the client's own shell tool, filled to its schema."""
    for want in SHELL_TOOLS:
        for tool in tools:
            if not isinstance(tool, dict):
                continue
            name, schema = _tool_spec(api, tool)
            if name.lower() != want:
                continue
            props = schema.get("properties") or {}
            args: dict[str, Any] = {}
            key = "cmd" if "cmd" in props else "command"
            args[key] = ["bash", "-lc", command] if (props.get(key) or {}).get("type") == "array" else command
            for req in schema.get("required") or []:
                if req not in args and (props.get(req) or {}).get("type") == "string":
                    args[req] = "Run the command the user asked for" if req == "description" else ""
            if "workdir" in props and "workdir" not in args:
                pass  # the client's cwd is the default
            return name, args
    return None


def _cid(seed: str, prefix: str) -> str:
    return prefix + hashlib.sha256(seed.encode()).hexdigest()[:24]


# ---- replies, per API --------------------------------------------------------------------------------------------


def messages_reply(body: dict[str, Any], usage: dict[str, Any], call: tuple[str, dict[str, Any]] | None,
                   seed: str) -> tuple[bytes, str]:
    """(bytes, content type) of a Messages answer: a tool_use or a text, streamed when asked."""
    mid = _cid(seed, "msg_")
    model = body.get("model", "")
    stop = "tool_use" if call else "end_turn"
    block: dict[str, Any] = (
        {"type": "tool_use", "id": _cid(seed, "toolu_"), "name": call[0], "input": call[1]}
        if call else {"type": "text", "text": REPLY}
    )
    if not body.get("stream"):
        return json.dumps({"id": mid, "type": "message", "role": "assistant", "content": [block], "model": model,
                           "stop_reason": stop, "stop_sequence": None, "usage": usage}).encode(), "application/json"
    start_usage = dict(usage)
    start_usage["output_tokens"] = 0
    out = _sse("message_start", {"type": "message_start", "message": {
        "id": mid, "type": "message", "role": "assistant", "content": [], "model": model, "stop_reason": None,
        "stop_sequence": None, "usage": start_usage}})
    if call:
        out += _sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {
            "type": "tool_use", "id": block["id"], "name": call[0], "input": {}}})
        out += _sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {
            "type": "input_json_delta", "partial_json": json.dumps(call[1])}})
    else:
        out += _sse("content_block_start", {"type": "content_block_start", "index": 0,
                                            "content_block": {"type": "text", "text": ""}})
        out += _sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                            "delta": {"type": "text_delta", "text": REPLY}})
    out += _sse("content_block_stop", {"type": "content_block_stop", "index": 0})
    out += _sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                  "usage": usage})
    out += _sse("message_stop", {"type": "message_stop"})
    return out, "text/event-stream"


def responses_reply(body: dict[str, Any], usage: dict[str, Any], call: tuple[str, dict[str, Any]] | None,
                    seed: str) -> tuple[bytes, str]:
    """(bytes, content type) of a Responses answer: a function_call or a message, streamed when asked."""
    rid = _cid(seed, "resp_")
    if call:
        item: dict[str, Any] = {"type": "function_call", "id": _cid(seed, "fc_"), "call_id": _cid(seed, "call_"),
                                "name": call[0], "arguments": json.dumps(call[1]), "status": "completed"}
    else:
        item = {"type": "message", "id": _cid(seed, "msg_"), "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": REPLY, "annotations": []}]}
    resp = {"id": rid, "object": "response", "created_at": int(time.time()), "model": body.get("model", ""),
            "status": "completed", "output": [item], "usage": usage}
    if not body.get("stream"):
        return json.dumps(resp).encode(), "application/json"
    seq = iter(range(1_000))
    pending = dict(resp, status="in_progress", output=[], usage=None)
    out = _sse("response.created", {"type": "response.created", "sequence_number": next(seq), "response": pending})
    out += _sse("response.in_progress", {"type": "response.in_progress", "sequence_number": next(seq),
                                         "response": pending})
    added = dict(item, status="in_progress")
    if call:
        added["arguments"] = ""
    else:
        added["content"] = []
    out += _sse("response.output_item.added", {"type": "response.output_item.added", "sequence_number": next(seq),
                                               "output_index": 0, "item": added})
    if call:
        out += _sse("response.function_call_arguments.delta", {
            "type": "response.function_call_arguments.delta", "sequence_number": next(seq), "item_id": item["id"],
            "output_index": 0, "delta": item["arguments"]})
        out += _sse("response.function_call_arguments.done", {
            "type": "response.function_call_arguments.done", "sequence_number": next(seq), "item_id": item["id"],
            "output_index": 0, "arguments": item["arguments"]})
    else:
        part = {"type": "output_text", "text": "", "annotations": []}
        out += _sse("response.content_part.added", {"type": "response.content_part.added", "sequence_number":
                    next(seq), "item_id": item["id"], "output_index": 0, "content_index": 0, "part": part})
        out += _sse("response.output_text.delta", {"type": "response.output_text.delta", "sequence_number":
                    next(seq), "item_id": item["id"], "output_index": 0, "content_index": 0, "delta": REPLY})
        out += _sse("response.output_text.done", {"type": "response.output_text.done", "sequence_number":
                    next(seq), "item_id": item["id"], "output_index": 0, "content_index": 0, "text": REPLY})
        out += _sse("response.content_part.done", {"type": "response.content_part.done", "sequence_number":
                    next(seq), "item_id": item["id"], "output_index": 0, "content_index": 0,
                    "part": dict(part, text=REPLY)})
    out += _sse("response.output_item.done", {"type": "response.output_item.done", "sequence_number": next(seq),
                                              "output_index": 0, "item": item})
    out += _sse("response.completed", {"type": "response.completed", "sequence_number": next(seq),
                                       "response": resp})
    return out, "text/event-stream"


def chat_reply(body: dict[str, Any], usage: dict[str, Any], call: tuple[str, dict[str, Any]] | None,
               seed: str) -> tuple[bytes, str]:
    """(bytes, content type) of a chat completion: tool_calls or text, streamed when asked."""
    cid = _cid(seed, "chatcmpl-")
    base = {"id": cid, "created": int(time.time()), "model": body.get("model", "")}
    finish = "tool_calls" if call else "stop"
    calls = [{"id": _cid(seed, "call_"), "type": "function",
              "function": {"name": call[0], "arguments": json.dumps(call[1])}}] if call else None
    if not body.get("stream"):
        msg: dict[str, Any] = {"role": "assistant", "content": None if call else REPLY}
        if calls:
            msg["tool_calls"] = calls
        return json.dumps(dict(base, object="chat.completion", choices=[
            {"index": 0, "message": msg, "finish_reason": finish}], usage=usage)).encode(), "application/json"
    chunk = dict(base, object="chat.completion.chunk")
    out = _sse(None, dict(chunk, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""},
                                           "finish_reason": None}]))
    if calls:
        out += _sse(None, dict(chunk, choices=[{"index": 0, "delta": {"tool_calls": [dict(calls[0], index=0)]},
                                                "finish_reason": None}]))
    else:
        out += _sse(None, dict(chunk, choices=[{"index": 0, "delta": {"content": REPLY}, "finish_reason": None}]))
    out += _sse(None, dict(chunk, choices=[{"index": 0, "delta": {}, "finish_reason": finish}]))
    if (body.get("stream_options") or {}).get("include_usage"):
        out += _sse(None, dict(chunk, choices=[], usage=usage))
    return out + b"data: [DONE]\n\n", "text/event-stream"


REPLIES = {"messages": messages_reply, "responses": responses_reply, "chat": chat_reply}


def api_of(path: str) -> str | None:
    """Which generation API a path is (None: pass it through as it is)."""
    if path.endswith("/messages"):
        return "messages"
    if path.endswith("/responses"):
        return "responses"
    if path.endswith("/chat/completions"):
        return "chat"
    return None


# ---- usage from the upstream's answer ---------------------------------------------------------------------------


def _sse_objects(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for line in raw.decode("utf-8", "replace").splitlines():
        if line.startswith("data:"):
            data = line[5:].strip()
            if data and data != "[DONE]":
                try:
                    obj = json.loads(data)
                except json.JSONDecodeError:
                    continue
                if isinstance(obj, dict):
                    out.append(obj)
    return out


def upstream_usage(api: str, raw: bytes, stream: bool) -> dict[str, Any] | None:
    """The usage object the upstream reported (the final one of a stream), in the API's own shape."""
    if not stream:
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            return None
        return obj.get("usage") if isinstance(obj, dict) else None
    usage: dict[str, Any] | None = None
    for obj in _sse_objects(raw):
        if api == "messages":
            if obj.get("type") == "message_start":
                usage = dict((obj.get("message") or {}).get("usage") or {})
            elif obj.get("type") == "message_delta" and isinstance(obj.get("usage"), dict):
                usage = dict(usage or {}, **obj["usage"])
        elif api == "responses":
            if obj.get("type") in ("response.completed", "response.incomplete"):
                usage = (obj.get("response") or {}).get("usage")
        elif isinstance(obj.get("usage"), dict):
            usage = obj["usage"]
    return usage


def cached_prompt(api: str, usage: dict[str, Any] | None) -> tuple[int, int] | None:
    """(cached, prompt) tokens of one usage object."""
    if not usage:
        return None
    if api == "messages":
        cached = int(usage.get("cache_read_input_tokens") or 0)
        prompt = int(usage.get("input_tokens") or 0) + cached + int(usage.get("cache_creation_input_tokens") or 0)
        return cached, prompt
    if api == "responses":
        return int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0), int(
            usage.get("input_tokens") or 0)
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0), int(
        usage.get("prompt_tokens") or 0)


# ---- the server -------------------------------------------------------------------------------------------------


class Layer:
    """One capture file, one upstream, labels set by the runner."""

    def __init__(self, upstream: str, capture: Path, *, passthrough: bool = False) -> None:
        self.upstream = upstream.rstrip("/")
        self.capture = capture
        self.passthrough = passthrough  # a tap: record and relay the upstream's own answer
        self.labels: dict[str, Any] = {}
        self.seq = 0
        self.http: aiohttp.ClientSession | None = None

    async def ping(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def label(self, request: web.Request) -> web.Response:
        self.labels = await request.json()
        return web.json_response({"ok": True, "seq": self.seq})

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.http is None:
            self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600), auto_decompress=True)
        raw = await request.read()
        self.seq += 1
        seq = self.seq
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        t0 = time.monotonic()
        async with self.http.request(request.method, self.upstream + request.path_qs, data=raw or None,
                                     headers=headers, allow_redirects=False) as up:
            up_raw = await up.read()
            status, up_headers = up.status, up.headers
        elapsed = time.monotonic() - t0
        api = api_of(request.path) if request.method == "POST" else None
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                body = raw.decode("utf-8", "replace")
        rec: dict[str, Any] = {
            "seq": seq, **self.labels, "method": request.method, "path": request.path, "query": request.query_string,
            "headers": {k: ("<redacted>" if k.lower() in REDACT else v) for k, v in request.headers.items()},
            "status": status, "elapsed_s": round(elapsed, 4), "body_bytes": len(raw),
            "kvgate": {k: v for k, v in up_headers.items() if k.lower().startswith("x-kvgate")},
        }
        reply: tuple[bytes, str] | None = None
        if api and status == 200 and isinstance(body, dict):
            usage = upstream_usage(api, up_raw, bool(body.get("stream")))
            cp = cached_prompt(api, usage)
            command = turn_command(api, body)
            call = shell_call(api, body.get("tools") or [], command) if command else None
            rec.update(api=api, usage=usage, cached=cp[0] if cp else None, prompt=cp[1] if cp else None,
                       kind="turn-open" if call else ("tool-result" if _follows_tool(api, body) else "other"),
                       tool_call=list(call) if call else None)
            if not self.passthrough:
                reply = REPLIES[api](body, usage or {}, call, f"{seq}:{self.labels}")
        elif status != 200:
            rec["error_body"] = up_raw[:2000].decode("utf-8", "replace")
        rec["body"] = body
        with self.capture.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        if reply is not None:
            return web.Response(body=reply[0], status=200, content_type=reply[1].split(";")[0])
        out_headers = {k: v for k, v in up_headers.items() if k.lower() not in HOP | {"content-encoding"}}
        return web.Response(body=up_raw, status=status, headers=out_headers)


def _follows_tool(api: str, body: dict[str, Any]) -> bool:
    """The newest input is a tool's result (the client sends what its tool printed)."""
    if api == "responses":
        items = body.get("input") or []
        return bool(items) and isinstance(items[-1], dict) and items[-1].get("type") == "function_call_output"
    msgs = body.get("messages") or []
    if not msgs:
        return False
    last = msgs[-1]
    if api == "chat":
        return last.get("role") == "tool"
    content = last.get("content")
    return isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "tool_result"
                                             for b in content)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--capture", type=Path, required=True)
    p.add_argument("--passthrough", action="store_true", help="relay the upstream's answers (a tap), no script")
    args = p.parse_args()
    layer = Layer(args.upstream, args.capture, passthrough=args.passthrough)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/_lab/label", layer.label)
    app.router.add_get("/_lab/ping", layer.ping)
    app.router.add_route("*", "/{tail:.*}", layer.handle)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
