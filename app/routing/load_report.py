"""vLLM's in-band load report: the ORCA `endpoint-load-metrics` response header, parsed.

A chat or completions request that carries `endpoint-load-metrics-format: TEXT` (or `JSON`) gets, on vLLM 0.32,
a header built by vllm/entrypoints/serve/utils/orca_metrics.py from its Prometheus gauges
`vllm:num_requests_waiting` and `vllm:kv_cache_usage_perc` (0-1, despite the name):

    endpoint-load-metrics: TEXT named_metrics.num_requests_waiting=3.0, named_metrics.kv_cache_usage_perc=0.4125
    endpoint-load-metrics: JSON {"named_metrics": {"num_requests_waiting": 0.0, "kv_cache_usage_perc": 0.05}}

vLLM answers only non-streaming replies (api_router.py passes the header to the JSONResponse, not to the
StreamingResponse), computed when the reply is built, i.e. after the request finished in the engine. With
several engines behind one server (data parallel) each engine's gauge is one more `name=value` pair; their
waiting requests add up and their KV usage is averaged. `TEXT ` with nothing after it (no gauge readable) and
anything malformed parse to None: the replica's load then stays as the last scrape left it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import orjson

REQUEST_HEADER = "endpoint-load-metrics-format"
RESPONSE_HEADER = "endpoint-load-metrics"
# The endpoints vLLM 0.32 answers with the header (chat/completion/api_router.py, completion/api_router.py).
LOAD_REPORT_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})

WAITING = "num_requests_waiting"
KV_USAGE = "kv_cache_usage_perc"
_TEXT_PREFIX = "named_metrics."


@dataclass(frozen=True, slots=True)
class LoadReport:
    """One replica's load as its reply reported it: engine queue and KV-cache usage (None: not reported)."""

    waiting: int | None
    kv_usage: float | None


def parse_load_report(value: str) -> LoadReport | None:
    """The header's waiting requests and KV usage, or None when it carries neither (or is malformed)."""
    fmt, _, data = value.strip().partition(" ")
    fmt = fmt.upper()
    if fmt == "TEXT":
        pairs = _text_pairs(data)
    elif fmt == "JSON":
        pairs = _json_pairs(data)
    else:
        return None
    if pairs is None:
        return None
    waiting = [v for k, v in pairs if k == WAITING]
    kv = [v for k, v in pairs if k == KV_USAGE]
    if not waiting and not kv:
        return None
    return LoadReport(
        waiting=round(sum(waiting)) if waiting else None,
        kv_usage=min(max(sum(kv) / len(kv), 0.0), 1.0) if kv else None,
    )


def _text_pairs(data: str) -> list[tuple[str, float]] | None:
    out: list[tuple[str, float]] = []
    for item in data.split(","):
        item = item.strip()
        if not item:
            continue
        name, eq, raw = item.partition("=")
        if not eq or not name.startswith(_TEXT_PREFIX):
            return None
        number = _number(raw.strip())
        if number is None:
            return None
        out.append((name[len(_TEXT_PREFIX) :], number))
    return out


def _json_pairs(data: str) -> list[tuple[str, float]] | None:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    named = doc.get("named_metrics") if isinstance(doc, dict) else None
    if not isinstance(named, dict):
        return None
    out: list[tuple[str, float]] = []
    for name, raw in named.items():
        number = _number(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) else None
        if number is None:
            return None
        out.append((name, number))
    return out


def _number(raw: str | float) -> float | None:
    try:
        number = float(raw)
    except ValueError:
        return None
    # A negative queue or usage is no load reading; nan/inf neither.
    return number if math.isfinite(number) and number >= 0 else None
