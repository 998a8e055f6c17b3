"""One aiohttp session that sends chat completions and measures them (streaming SSE or not)."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import orjson

from app.bench.spec import RequestRecord
from app.bench.workloads import BenchRequest


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


def _apply_usage(rec: RequestRecord, usage: dict[str, Any]) -> None:
    rec.usage_reported = True
    rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    rec.output_tokens = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    rec.cached_tokens = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0


def _delta_text(choice: dict[str, Any]) -> str | None:
    """Text a streamed choice carries, or None when it carries no token (role-only or finish chunks)."""
    delta = choice.get("delta")
    if not delta:
        return None
    text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
    if text:
        return str(text)
    if delta.get("tool_calls"):
        return ""
    return None


class BenchClient:
    """Sends BenchRequests to an OpenAI-compatible API; create inside a running loop, close when done."""

    def __init__(self, base_url: str, connections: int, timeout_s: float) -> None:
        self.root = api_root(base_url)
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
        payload = orjson.dumps(req.body)
        start = time.perf_counter()
        rec.start_s = start - t0
        try:
            async with self._session.post(f"{self.root}/chat/completions", data=payload, headers=headers) as resp:
                rec.status = resp.status
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
        data = orjson.loads(raw)
        if isinstance(data.get("usage"), dict):
            _apply_usage(rec, data["usage"])
        choices = data.get("choices") or []
        text = str((choices[0].get("message") or {}).get("content") or "") if choices else ""
        rec.ok = True
        return text

    async def _read_stream(self, resp: aiohttp.ClientResponse, rec: RequestRecord, start: float) -> str:
        parts: list[str] = []
        buf = b""
        last_token_at = 0.0
        done = False
        # Split whole reads ourselves: several events in one read cost one await, not one per line. With one
        # event per read it costs the same as readline, ~27 µs of CPU per chunk (experiments/bench_client_cost.py).
        async for chunk in resp.content.iter_any():
            now = time.perf_counter()
            buf += chunk
            if b"\n" not in chunk:
                continue
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                try:
                    event = orjson.loads(data)
                except orjson.JSONDecodeError:
                    continue
                if "error" in event and not event.get("choices"):
                    rec.error = "stream error: " + _error_message(data)
                    rec.e2e_s = now - start
                    return "".join(parts)
                usage = event.get("usage")
                if isinstance(usage, dict):
                    _apply_usage(rec, usage)
                for choice in event.get("choices") or ():
                    text = _delta_text(choice)
                    if text is None:
                        continue
                    parts.append(text)
                    rec.token_chunks += 1
                    if rec.ttft_s is None:
                        rec.ttft_s = now - start
                    else:
                        rec.itl_s.append(now - last_token_at)
                    last_token_at = now
            if done:
                break
        end = time.perf_counter()
        rec.e2e_s = end - start
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
