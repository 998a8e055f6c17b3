"""A small Prometheus text parser: only the named series, summed over label sets (engines, models).

Hand-written because the scraper parses every replica's /metrics every probe: on a 58-60 KB vLLM 0.32 scrape
(tests/routing/fixtures/vllm_0_32_*_metrics.txt) it takes 0.11 ms against 9.78 ms for
prometheus_client.parser (earlier measurement, quiet machine); re-measured 2026-12-01 with the machine loaded
(load 5-7 on 2 cores): 0.20-0.24 ms against 10.6-11.0 ms, 47-53x (docs/measurements/performance.md has the command).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

# What the router reads from vLLM's /metrics (V1 names). Counters are listed without `_total`.
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
PREFIX_QUERIES = "vllm:prefix_cache_queries"
PREFIX_HITS = "vllm:prefix_cache_hits"
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
PREEMPTIONS = "vllm:num_preemptions"
SPEC_DRAFTS = "vllm:spec_decode_num_drafts"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
TTFT_SUM = "vllm:time_to_first_token_seconds_sum"
TTFT_COUNT = "vllm:time_to_first_token_seconds_count"

GAUGES = (RUNNING, WAITING, KV_USAGE)
COUNTERS = (
    PREFIX_QUERIES,
    PREFIX_HITS,
    PROMPT_TOKENS,
    GENERATION_TOKENS,
    PREEMPTIONS,
    SPEC_DRAFTS,
    SPEC_DRAFT_TOKENS,
    SPEC_ACCEPTED,
    TTFT_SUM,
    TTFT_COUNT,
)
VLLM_SERIES = frozenset(GAUGES + COUNTERS)
# A fraction per engine: several engines (data parallel) average, they do not add up.
AVERAGED = frozenset({KV_USAGE})


def _sample_name(line: str) -> tuple[str, int]:
    """The metric name of a sample line and the index where its value part starts."""
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        # Label values may hold spaces or braces; the value follows the last closing brace.
        return line[:brace], line.rfind("}") + 1
    if space == -1:
        return line, len(line)
    return line[:space], space


def parse_metrics(
    text: str, names: Iterable[str] = VLLM_SERIES, averaged: Iterable[str] = AVERAGED
) -> dict[str, float]:
    """Sum each wanted series over its label sets (`averaged` ones: mean); `x_total` counts as `x`.

    Missing series are absent; malformed or NaN samples are skipped rather than failing the scrape.
    """
    wanted = frozenset(names)
    out: dict[str, float] = {}
    seen: dict[str, int] = {}
    # A C-level prefix test drops most lines (histogram buckets, other libraries) before any parsing.
    prefixes = tuple(wanted)
    for line in text.splitlines():
        if not line.startswith(prefixes):
            continue
        name, value_at = _sample_name(line)
        if name.endswith("_total"):
            name = name[:-6]
        if name not in wanted:
            continue
        parts = line[value_at:].split()
        if not parts:
            continue
        try:
            value = float(parts[0])
        except ValueError:
            continue
        if math.isnan(value):
            continue
        out[name] = out.get(name, 0.0) + value
        seen[name] = seen.get(name, 0) + 1
    for name in averaged:
        if name in out:
            out[name] /= seen[name]
    return out
