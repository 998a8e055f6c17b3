"""The upstream stage: send a request to one vLLM replica and relay its answer, capturing usage on the way."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import aiohttp
import orjson

from app.config import UpstreamConfig
from app.context import RequestContext, Usage
from app.errors import GatewayError, error_body, upstream_timeout, upstream_unreachable

_DONE = b"data: [DONE]"
_HOP_HEADERS = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"})


def create_session(cfg: UpstreamConfig) -> aiohttp.ClientSession:
    """One pooled client session for all replicas; timeouts per the config."""
    connector = aiohttp.TCPConnector(
        limit=0,
        limit_per_host=cfg.max_connections_per_replica,
        keepalive_timeout=30,
        enable_cleanup_closed=True,
    )
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=cfg.connect_timeout_s, sock_read=cfg.read_timeout_s
    )
    # auto_decompress off: bodies are relayed as sent, and vLLM does not compress anyway.
    return aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False, json_serialize=lambda o: orjson.dumps(o).decode()
    )


class RetryableUpstreamError(Exception):
    """Nothing reached the client yet and another replica may succeed: connect error, 5xx, early timeout."""

    def __init__(self, error: GatewayError, *, replica_fault: bool) -> None:
        super().__init__(error.message)
        self.error = error
        self.replica_fault = replica_fault


@dataclass(slots=True)
class UpstreamReply:
    """A complete (non-streaming or error) upstream answer, ready to relay."""

    status: int
    body: bytes
    content_type: str


def rewrite_model(body: bytes, served: str, public: str) -> bytes:
    """Put the public model name back where vLLM wrote its served name, without re-serializing."""
    if served == public:
        return body
    return body.replace(b'"model":"' + served.encode() + b'"', b'"model":"' + public.encode() + b'"')


def capture_usage(usage_obj: Mapping[str, object] | None, into: Usage) -> None:
    """Copy an OpenAI `usage` object (with vLLM's prompt_tokens_details) into the request record."""
    if not usage_obj:
        return
    into.prompt_tokens = int(usage_obj.get("prompt_tokens") or 0)  # type: ignore[call-overload]
    into.completion_tokens = int(usage_obj.get("completion_tokens") or 0)  # type: ignore[call-overload]
    details = usage_obj.get("prompt_tokens_details")
    if isinstance(details, Mapping):
        into.cached_tokens = int(details.get("cached_tokens") or 0)
    into.reported = True


def _note_choices(ctx: RequestContext, choices: object) -> bool:
    """Record finish reasons; True when a choice carried generated content."""
    produced = False
    if not isinstance(choices, list):
        return produced
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        reason = choice.get("finish_reason")
        if reason:
            ctx.finish_reasons.append(reason)
        delta = choice.get("delta")
        if (delta and (delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content"))) or (
            choice.get("text")
        ):
            produced = True
    return produced


def _upstream_error(err: BaseException, replica: str) -> GatewayError:
    if isinstance(err, TimeoutError | aiohttp.ServerTimeoutError):
        return upstream_timeout(f"upstream {replica} timed out")
    return upstream_unreachable(f"upstream {replica} unreachable: {type(err).__name__}")


async def open_upstream(
    session: aiohttp.ClientSession, ctx: RequestContext, url: str, payload: bytes, headers: dict[str, str]
) -> aiohttp.ClientResponse:
    """Send the request and wait for the response head; failures before any byte are retryable."""
    replica = url.split("/v1/", 1)[0]
    ctx.timing.upstream_start = time.perf_counter()
    try:
        resp = await session.post(url, data=payload, headers=headers)
    except (TimeoutError, aiohttp.ClientError, OSError) as err:
        raise RetryableUpstreamError(_upstream_error(err, replica), replica_fault=True) from err
    ctx.timing.first_byte = time.perf_counter()
    if resp.status >= 500:
        await _read_safely(resp)
        resp.release()
        failure = GatewayError(
            502, f"upstream {replica} answered {resp.status}", type="upstream_error", code="upstream_error"
        )
        failure.headers["x-kvgate-upstream-status"] = str(resp.status)
        raise RetryableUpstreamError(failure, replica_fault=True)
    return resp


async def _read_safely(resp: aiohttp.ClientResponse) -> bytes:
    try:
        return await resp.read()
    except (TimeoutError, aiohttp.ClientError):
        return b""


async def read_complete(
    resp: aiohttp.ClientResponse, ctx: RequestContext, served: str
) -> UpstreamReply:
    """Read a non-streaming reply whole; capture usage, id and finish reasons from a 200."""
    try:
        body = await resp.read()
    except (TimeoutError, aiohttp.ClientError) as err:
        resp.close()
        raise _upstream_error(err, str(resp.url.origin())) from err
    finally:
        ctx.timing.end = time.perf_counter()
    content_type = resp.headers.get("content-type", "application/json")
    if resp.status == 200:
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            doc = None
        if isinstance(doc, dict):
            capture_usage(doc.get("usage"), ctx.usage)
            ctx.response_id = doc.get("id")
            _note_choices(ctx, doc.get("choices"))
        body = rewrite_model(body, served, ctx.model)
        ctx.timing.first_token = ctx.timing.end
    return UpstreamReply(resp.status, body, content_type)


def _plain_token_chunk(event: bytes) -> bool:
    """A mid-stream token chunk carries nothing to account for: no usage, finish reason or error.

    Checked on the bytes (vLLM writes compact JSON) so most chunks are relayed without being parsed.
    """
    return b'"usage":{' not in event and b'"finish_reason":"' not in event and b'"error"' not in event


def sse_error_event(message: str, type: str, code: str) -> bytes:
    """An SSE event carrying OpenAI's error envelope, as OpenAI ends a stream that failed."""
    return b"data: " + error_body(message, type, None, code) + b"\n\n"


class StreamRelay:
    """Relays an upstream SSE stream event by event, untouched, while reading usage from it.

    The gateway always asks vLLM for the final usage chunk; when the client did not, that chunk is
    dropped from what the client sees (its numbers are kept). Only chunks that must change (a model
    name to rewrite) are touched, by byte substitution.
    """

    def __init__(self, resp: aiohttp.ClientResponse, ctx: RequestContext, served: str) -> None:
        self._resp = resp
        self._ctx = ctx
        self._served = served
        self._served_marker = b'"model":"' + served.encode() + b'"'
        self._public_marker = b'"model":"' + ctx.model.encode() + b'"'
        self._rewrite = served != ctx.model
        self.saw_done = False

    def _observe(self, event: bytes) -> bytes | None:
        """Account for one SSE event; return the bytes to forward, or None to drop it."""
        ctx = self._ctx
        if event.startswith(_DONE):
            self.saw_done = True
            return None  # emitted by the caller after the trailer
        if not event.startswith(b"data:"):
            return event
        if ctx.timing.first_token and _plain_token_chunk(event):
            return event.replace(self._served_marker, self._public_marker) if self._rewrite else event
        try:
            doc = orjson.loads(event[5:])
        except orjson.JSONDecodeError:
            return event
        if not isinstance(doc, dict):
            return event
        if ctx.response_id is None:
            ctx.response_id = doc.get("id")
        usage = doc.get("usage")
        choices = doc.get("choices")
        if usage:
            capture_usage(usage, ctx.usage)
        if _note_choices(ctx, choices) and not ctx.timing.first_token:
            ctx.timing.first_token = time.perf_counter()
        if usage and not choices and not ctx.client_wants_usage:
            return None
        if "error" in doc:
            ctx.error_type = "upstream_stream_error"
        if self._rewrite:
            event = event.replace(self._served_marker, self._public_marker)
        return event

    async def events(self) -> AsyncIterator[bytes]:
        """Yield batches of complete events as they arrive; raise GatewayError on upstream failure."""
        buf = b""
        try:
            async for chunk in self._resp.content.iter_any():
                buf += chunk
                out: list[bytes] = []
                while True:
                    cut = buf.find(b"\n\n")
                    if cut < 0:
                        break
                    event = buf[: cut + 2]
                    buf = buf[cut + 2 :]
                    kept = self._observe(event)
                    if kept is not None:
                        out.append(kept)
                if out:
                    yield b"".join(out)
        except (TimeoutError, aiohttp.ClientError) as err:
            raise _upstream_error(err, str(self._resp.url.origin())) from err
        finally:
            self._ctx.timing.end = time.perf_counter()
        if not self.saw_done:
            raise upstream_unreachable("upstream closed the stream before [DONE]")

    def close(self) -> None:
        """Drop the upstream connection (aborts the request in vLLM when unfinished)."""
        if not self.saw_done:
            self._resp.close()
        else:
            self._resp.release()


def forward_headers(inbound: Mapping[str, str], request_id: str) -> dict[str, str]:
    """Headers sent to vLLM: content type, request id, and trace context (added later by telemetry)."""
    return {"content-type": "application/json", "x-request-id": request_id}


def relay_response_headers(upstream: Mapping[str, str]) -> dict[str, str]:
    """Upstream response headers worth passing on (not hop-by-hop ones)."""
    return {k: v for k, v in upstream.items() if k.lower() not in _HOP_HEADERS and not k.lower().startswith("x-kvgate")}
