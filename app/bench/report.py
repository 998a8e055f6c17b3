"""From request records to a summary: percentiles, throughput, goodput, cached ratio and dollars."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import orjson

from app.bench.pricing import CostSummary, cost_summary
from app.bench.spec import BenchSpec, RequestRecord

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile with linear interpolation between closest ranks (numpy's default); None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


@dataclass(frozen=True, slots=True)
class Distribution:
    """p50/p90/p99 and mean of one latency, in milliseconds."""

    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None

    @classmethod
    def of_seconds(cls, values: Iterable[float | None]) -> Distribution:
        """Summarize latencies given in seconds (None entries skipped)."""
        ms = [v * 1000.0 for v in values if v is not None]
        mean = sum(ms) / len(ms) if ms else None
        p50, p90, p99 = (percentile(ms, p) for p in PERCENTILES)
        return cls(len(ms), mean, p50, p90, p99)


@dataclass(frozen=True, slots=True)
class Summary:
    """The numbers a bench run reports."""

    requests: int
    ok: int
    errors: int
    error_kinds: dict[str, int]
    wall_s: float  # the span throughput is measured over: the whole run, or the steady window after warm-up
    ttft_ms: Distribution
    itl_ms: Distribution
    tpot_ms: Distribution
    e2e_ms: Distribution
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int  # of the measured requests
    cached_ratio: float | None
    requests_per_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    goodput_requests_per_s: float | None
    goodput_ratio: float | None
    cost: CostSummary
    usage_missing: int = 0
    # What the gateway billed the measured requests (sum of x-kvgate-cost-usd); None when nothing reported one.
    gateway_cost_usd: float | None = None


def meets_slo(rec: RequestRecord, slo_ttft_ms: float | None, slo_tpot_ms: float | None) -> bool:
    """A successful request within the TTFT and TPOT SLOs (an unknown TPOT, e.g. one output token, passes)."""
    if not rec.ok:
        return False
    if slo_ttft_ms is not None and (rec.ttft_s is None or rec.ttft_s * 1000.0 > slo_ttft_ms):
        return False
    return not (slo_tpot_ms is not None and rec.tpot_s is not None and rec.tpot_s * 1000.0 > slo_tpot_ms)


def _error_kind(error: str) -> str:
    return error.split(":", 1)[0]


@dataclass(frozen=True, slots=True)
class Window:
    """The span throughput is measured over and the tokens and completions that fall in it."""

    span_s: float
    completed: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: float


def _whole_run(ok: Sequence[RequestRecord], wall_s: float) -> Window:
    return Window(max(wall_s, 1e-9), len(ok), sum(r.prompt_tokens for r in ok), sum(r.cached_tokens for r in ok),
                  sum(r.output_tokens for r in ok))


def _arrivals(r: RequestRecord) -> list[tuple[float, float]]:
    """(time, tokens) of each token-bearing chunk; a non-streamed reply arrives whole at its end."""
    if not r.ok or r.e2e_s is None:
        return []
    if r.ttft_s is None or not r.token_chunks:
        return [(r.start_s + r.e2e_s, float(r.output_tokens))]
    per_chunk = r.output_tokens / r.token_chunks
    t = r.start_s + r.ttft_s
    out = [(t, per_chunk)]
    for gap in r.itl_s:
        t += gap
        out.append((t, per_chunk))
    return out


def steady_window(records: Sequence[RequestRecord]) -> Window | None:
    """After warm-up, the span while the offered load was still whole: from the first measured request's start
    to the first completion after the last request was sent (later the load drains). Every token that arrived
    in it counts, whichever request it belonged to. With fixed-length outputs a closed loop runs in waves; the
    span then covers the whole last wave, its prefill burst included."""
    measured = [r for r in records if not r.warmup]
    if not measured or len(measured) == len(records):
        return None
    t_a = min(r.start_s for r in measured)
    last_issue = max(r.start_s for r in records)
    ends = [r.start_s + r.e2e_s for r in records if r.e2e_s is not None]
    t_b = min((e for e in ends if e > last_issue), default=last_issue)
    if t_b - t_a <= 0:
        return None
    completed = prompt = cached = 0
    output = 0.0
    for r in records:
        if r.ok and r.e2e_s is not None and t_a <= r.start_s + r.e2e_s <= t_b:
            completed += 1
        first = None if not r.ok else r.start_s + (r.ttft_s if r.ttft_s is not None else r.e2e_s or 0.0)
        if first is not None and t_a <= first <= t_b:
            prompt += r.prompt_tokens  # a prompt counts as processed when its first token appears
            cached += r.cached_tokens
        output += sum(n for t, n in _arrivals(r) if t_a <= t <= t_b)
    return Window(t_b - t_a, completed, prompt, cached, output)


def summarize(records: Sequence[RequestRecord], wall_s: float, spec: BenchSpec) -> Summary:
    """Summarize a run: latencies over the measured (non-warm-up) requests; throughput over the whole run,
    or with warm-up over the steady window (see `steady_window`)."""
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    whole = _whole_run(ok, wall_s)
    window = steady_window(records) or whole
    span = window.span_s
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    output = sum(r.output_tokens for r in ok)
    requests_per_s = window.completed / span
    if window is not whole and output and window.output_tokens:
        # Completions bunch up at a wave's end, right where the window closes; the token rate over the mean
        # output length is the steady request rate without that boundary effect.
        requests_per_s = window.output_tokens / span / (output / len(ok))
    goodput: float | None = None
    goodput_ratio: float | None = None
    if spec.slo_ttft_ms is not None or spec.slo_tpot_ms is not None:
        good = sum(1 for r in measured if meets_slo(r, spec.slo_ttft_ms, spec.slo_tpot_ms))
        goodput_ratio = good / len(measured) if measured else None
        goodput = requests_per_s * (good / len(ok)) if ok else 0.0
    kinds = Counter(_error_kind(r.error) for r in measured if not r.ok and r.error)
    w_uncached = window.prompt_tokens - window.cached_tokens
    return Summary(
        requests=len(measured),
        ok=len(ok),
        errors=len(measured) - len(ok),
        error_kinds=dict(kinds.most_common()),
        wall_s=span,
        ttft_ms=Distribution.of_seconds(r.ttft_s for r in ok),
        itl_ms=Distribution.of_seconds(x for r in ok for x in r.itl_s),
        tpot_ms=Distribution.of_seconds(r.tpot_s for r in ok),
        e2e_ms=Distribution.of_seconds(r.e2e_s for r in ok),
        prompt_tokens=prompt,
        cached_tokens=cached,
        output_tokens=output,
        cached_ratio=cached / prompt if prompt else None,
        requests_per_s=requests_per_s,
        output_tokens_per_s=window.output_tokens / span,
        total_tokens_per_s=(window.prompt_tokens + window.output_tokens) / span,
        goodput_requests_per_s=goodput,
        goodput_ratio=goodput_ratio,
        cost=cost_summary(spec.pricing, span, w_uncached, window.cached_tokens, round(window.output_tokens)),
        usage_missing=sum(1 for r in ok if not r.usage_reported),
        gateway_cost_usd=_billed(measured),
    )


def _billed(records: list[RequestRecord]) -> float | None:
    billed = [r.cost_usd for r in records if r.cost_usd is not None]
    return sum(billed) if billed else None


@dataclass(slots=True)
class BenchResult:
    """A finished run: the spec as run (model resolved), every request's record, and the summary."""

    spec: BenchSpec
    records: list[RequestRecord]
    summary: Summary
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, *, records: bool = True) -> dict[str, Any]:
        """JSON-ready data (API keys never included)."""
        out: dict[str, Any] = {"spec": self.spec.public_dict(), "summary": asdict(self.summary)}
        if self.extra:
            out["extra"] = self.extra
        if records:
            out["records"] = [r.to_dict() for r in self.records]
        return out

    def to_json(self, *, records: bool = True) -> str:
        """The result as a JSON document."""
        return orjson.dumps(self.to_dict(records=records), option=orjson.OPT_INDENT_2).decode()


def rescaled(result: BenchResult, time_scale: float) -> BenchResult:
    """The result in the target's modeled time: a sim run with `--time-scale X` runs its clock X times faster,
    so every measured duration is multiplied by X (throughput divided by X) and the summary recomputed."""
    if time_scale == 1.0:
        return result
    records = []
    for r in result.records:
        rec = replace(r, start_s=r.start_s * time_scale, itl_s=[x * time_scale for x in r.itl_s])
        rec.ttft_s = None if r.ttft_s is None else r.ttft_s * time_scale
        rec.e2e_s = None if r.e2e_s is None else r.e2e_s * time_scale
        rec.tpot_s = None if r.tpot_s is None else r.tpot_s * time_scale
        records.append(rec)
    spec = replace(result.spec, time_scale=time_scale)
    summary = summarize(records, result.summary.wall_s * time_scale, spec)
    return BenchResult(spec=spec, records=records, summary=summary, extra=dict(result.extra))


def sweep_json(results: Sequence[BenchResult], *, records: bool = True) -> str:
    """Several runs (a concurrency sweep) as one JSON document."""
    doc = {"sweep": [r.to_dict(records=records) for r in results]}
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode()
