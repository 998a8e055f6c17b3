"""One aiohttp session that sends requests (chat, Responses or Messages) and measures them, streaming SSE or not."""

from __future__ import annotations

import time

import aiohttp
import orjson

from app.bench.apis import PATHS, STREAM_READERS, to_body, whole_text
from app.bench.spec import RequestRecord
from app.bench.workloads import BenchRequest
from app.headers import COST_USD as COST_HEADER
from app.headers import ROUTE as ROUTE_HEADER

_COST_TRAILER = b": " + COST_HEADER.encode() + b" "  # a kvgate stream's cost, in an SSE comment before its end


def _note_cost(line: bytes, rec: RequestRecord) -> bool:
    """Record the cost a kvgate stream's trailer line states; False for any other line."""
    if not line.startswith(_COST_TRAILER):
        return False
    rec.cost_usd = float(line[len(_COST_TRAILER) :])
    return True


def api_root(base_url: str) -> str:
    """`http://h:p` or `http://h:p/v1` → `http://h:p/v1`."""
    root = base_url.rstrip("/")
    return root if root.endswith("/v1") else root + "/v1"


def _error_message(raw: bytes) -> str:
    try:
        data = orjson.loads(raw)
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict) and err.get("message"):
            return str(err.get("type") or "error") + ": " + str(err["message"])[:200]
    except orjson.JSONDecodeError:
        pass
    return raw[:200].decode("utf-8", "replace")


class BenchClient:
    """Sends BenchRequests to an OpenAI-compatible API; create inside a running loop, close when done."""

    def __init__(self, base_url: str, connections: int, timeout_s: float, api: str = "chat",
                 more_base_urls: tuple[str, ...] = ()) -> None:
        if api not in PATHS:
            raise ValueError(f"unknown api {api!r}")
        self.root = api_root(base_url)
        self.api = api
        # Session i to URL i mod n: a session's turns stay on one gateway process.
        self._urls = [api_root(u) + PATHS[api] for u in (base_url, *more_base_urls)]
        self._on_event = STREAM_READERS[api]
        connector = aiohttp.TCPConnector(limit=max(connections, 1), limit_per_host=0, force_close=False)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=timeout_s, sock_connect=10),
            json_serialize=lambda o: orjson.dumps(o).decode(),
        )

    async def close(self) -> None:
        """Close the connection pool."""
        await self._session.close()

    async def first_model(self, api_key: str | None) -> str:
        """The first model id GET /v1/models lists."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        async with self._session.get(f"{self.root}/models", headers=headers) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"GET /v1/models: HTTP {resp.status}: {_error_message(raw)}")
        data = orjson.loads(raw).get("data") or []
        if not data:
            raise RuntimeError("GET /v1/models listed no models; pass --model")
        return str(data[0]["id"])

    async def send(self, req: BenchRequest, rec: RequestRecord, t0: float) -> str:
        """Send one request, fill `rec` with what it measured, and return the reply text ('' on error)."""
        headers = {"Content-Type": "application/json", **req.headers}
        if req.api_key:
            headers["Authorization"] = f"Bearer {req.api_key}"
        payload = orjson.dumps(to_body(self.api, req.body))
        start = time.perf_counter()
        rec.start_s = start - t0
        try:
            url = self._urls[req.session % len(self._urls)]
            async with self._session.post(url, data=payload, headers=headers) as resp:
                rec.status = resp.status
                rec.route = resp.headers.get(ROUTE_HEADER)
                cost = resp.headers.get(COST_HEADER)
                if cost is not None:
                    rec.cost_usd = float(cost)
                if resp.status != 200:
                    rec.error = f"HTTP {resp.status}: {_error_message(await resp.read())}"
                    rec.e2e_s = time.perf_counter() - start
                    return ""
                if req.body.get("stream"):
                    return await self._read_stream(resp, rec, start)
                return await self._read_whole(resp, rec, start)
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            rec.error = f"{type(err).__name__}: {err}"[:200]
            rec.e2e_s = time.perf_counter() - start
            return ""

    async def _read_whole(self, resp: aiohttp.ClientResponse, rec: RequestRecord, start: float) -> str:
        raw = await resp.read()
        end = time.perf_counter()
        rec.e2e_s = rec.ttft_s = end - start
        text = whole_text(self.api, orjson.loads(raw), rec)
        rec.ok = True
        return text

    async def _read_stream(self, resp: aiohttp.ClientResponse, rec: RequestRecord, start: float) -> str:
        parts: list[str] = []
        buf = b""
        last_token_at = 0.0
        done = False
        rest: list[bytes] = []  # lines after the final event (a kvgate gateway's cost trailer follows it)
        on_event = self._on_event
        # Split whole reads ourselves: several events in one read cost one await, not one per line. With one
        # event per read it costs the same as readline, ~27 µs of CPU per chunk (experiments/bench_client_cost.py).
        async for chunk in resp.content.iter_any():
            now = time.perf_counter()
            buf += chunk
            if b"\n" not in chunk:
                continue
            *lines, buf = buf.split(b"\n")
            # The one SSE framer for all three APIs: every event's payload is on its `data:` line (Responses and
            # Messages repeat the event name inside it as `type`), so `event:` lines are skipped.
            for i, line in enumerate(lines):
                if not line.startswith(b"data:"):
                    _note_cost(line, rec)
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                try:
                    event = orjson.loads(data)
                except orjson.JSONDecodeError:
                    continue
                text, finished, error = on_event(event, rec)
                if error is not None:
                    rec.error = "stream error: " + error
                    rec.e2e_s = now - start
                    return "".join(parts)
                if text is not None:
                    parts.append(text)
                    rec.token_chunks += 1
                    if rec.ttft_s is None:
                        rec.ttft_s = now - start
                    else:
                        rec.itl_s.append(now - last_token_at)
                    last_token_at = now
                if finished:
                    done = True
                    rest = lines[i + 1 :]
                    break
            if done:
                break
        end = time.perf_counter()
        rec.e2e_s = end - start
        if done and rec.cost_usd is None:
            await self._read_trailer(resp, [*rest, buf], rec)
        if not done and not rec.usage_reported and rec.token_chunks == 0:
            rec.error = "stream ended without data"
            return ""
        if not rec.usage_reported:
            # No usage chunk: fall back to counting token-bearing chunks (a lower bound with multi-token chunks).
            rec.output_tokens = rec.token_chunks
        if rec.ttft_s is not None and rec.output_tokens > 1:
            rec.tpot_s = (rec.e2e_s - rec.ttft_s) / (rec.output_tokens - 1)
        rec.ok = True
        return "".join(parts)

    @staticmethod
    async def _read_trailer(resp: aiohttp.ClientResponse, lines: list[bytes], rec: RequestRecord) -> None:
        """The cost a kvgate gateway writes after a Responses or Messages stream's final event (read to the end of
        the stream, after the request's times were taken; a stream without one just ends)."""
        tail = b"\n".join(lines)
        async for chunk in resp.content.iter_any():
            tail += chunk
        for line in tail.split(b"\n"):
            if _note_cost(line, rec):
                return
