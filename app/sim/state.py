"""What one sim app owns (options, tokenizer, engine) and the raw-ASGI body helpers its endpoints share."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from starlette.types import Receive, Scope, Send

from app.sim.chat import BuiltinChat, ChatPrompt, FolderChat, is_model_folder
from app.sim.engine import Engine, EngineConfig, OutputStream
from app.sim.options import SimOptions
from app.sim.sender import DirectSender
from app.sim.template import SMOLLM2_DEFAULT_SYSTEM
from app.sim.tokenizer import Tokenizer, load_tokenizer


class SimState:
    """Everything one sim app owns: options, tokenizer and engine."""

    def __init__(self, options: SimOptions) -> None:
        self.options = options
        self.sched_config = options.scheduler_config()
        self.tokenizer: Tokenizer = load_tokenizer(options.tokenizer)
        options.validate_kv_events()
        spec = options.spec()
        self.spec_enabled = spec is not None
        self.accept_rules = options.accept_rules()
        self.engine = Engine(
            EngineConfig(
                profile=options.resolved_profile(),
                scheduler=self.sched_config,
                kv_blocks=options.num_kv_blocks(),
                block_size=options.resolved_block_size(),
                time_scale=options.time_scale,
                step_trace=options.step_trace,
                seed=options.seed,
                enable_prefix_caching=options.enable_prefix_caching,
                mean_output_tokens=options.mean_output_tokens,
                model_name=options.model,
                hash_algo=options.hash_algo(),
                kv_events=options.kv_events,
                kv_replay=options.kv_replay,
                kv_topic=options.kv_topic,
                kv_buffer_steps=options.kv_buffer_steps,
            ),
            self.tokenizer.output_vocab(),
            self.tokenizer.eos_token_id,
        )
        self.default_system = SMOLLM2_DEFAULT_SYSTEM if options.default_system_prompt else None
        # A model folder brings its own chat template (default system turn, tools): those flags then do not apply.
        self.chat: ChatPrompt = (
            FolderChat(options.tokenizer, self.engine.pool.block_size, self.engine.pool.hash_algo)
            if options.tokenizer is not None and is_model_folder(options.tokenizer)
            else BuiltinChat(self.tokenizer, default_system=self.default_system, render_tools=options.render_tools)
        )
        self.created = int(time.time())


async def read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ConnectionResetError
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body", False):
            return b"".join(chunks)


async def send_whole(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


JSON_HEADER = (b"content-type", b"application/json")


@dataclass(slots=True)
class Incoming:
    """A POST that arrived whole: its headers (lowercase names), body, request id and the reply's headers."""

    headers: dict[bytes, bytes]
    raw: bytes
    request_id: str
    out_headers: list[tuple[bytes, bytes]]


async def read_post(scope: Scope, receive: Receive, send: Send, state: SimState) -> Incoming | None:
    """What every raw POST route of the sim reads first; None when it already answered (405) or the client left."""
    if scope["method"] != "POST":
        await send_whole(send, 405, b'{"detail":"Method Not Allowed"}', [JSON_HEADER])
        return None
    headers = {k.lower(): v for k, v in scope["headers"]}
    try:
        raw = await read_body(receive)
    except ConnectionResetError:
        return None
    rid = (headers.get(b"x-request-id") or b"").decode() or uuid.uuid4().hex[:16]
    out_headers = [JSON_HEADER]
    if state.options.enable_request_id_headers:
        out_headers.append((b"x-request-id", rid.encode()))
    return Incoming(headers, raw, rid, out_headers)


async def watch_disconnect(receive: Receive, state: SimState, stream: OutputStream) -> None:
    """Abort the stream's engine work when the client goes away (run as a task beside the request)."""
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            state.engine.abort(stream)
            return


async def stream_to_end(stream: OutputStream, sender: DirectSender) -> None:
    """Wait for a streamed request's last token, then for its last write to reach the client."""
    while not stream.finished and not stream.closed:
        await stream.event.wait()
        stream.event.clear()
    await sender.drained()
