"""vLLM V1's Prometheus metrics (names, types, buckets, labels), rendered without prometheus_client's per-call locks."""

from __future__ import annotations

import bisect
import time
from collections.abc import Sequence

from prometheus_client.utils import floatToGoString as _fmt

from app.sim.scheduler import Scheduler

# Bucket edges as vllm/v1/metrics/buckets.py (0.32) defines them.
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


def request_tokens_buckets(max_model_len: int) -> list[float]:
    """vLLM's 1-2-5 series capped at max_model_len."""
    out: list[float] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_model_len:
                return out
            out.append(m * scale)
        scale *= 10


def _labels(base: dict[str, str], **extra: str) -> str:
    # vLLM's multiprocess-mode exposition sorts label names.
    merged = {**base, **extra}
    return ",".join(f'{k}="{merged[k]}"' for k in sorted(merged))


class Histogram:
    """A Prometheus histogram: per-bucket counts (cumulated when rendered), sum and count."""

    __slots__ = ("bounds", "count", "counts", "doc", "name", "sum")

    def __init__(self, name: str, doc: str, bounds: Sequence[float]) -> None:
        self.name, self.doc = name, doc
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        """Record `value` n times."""
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n

    def render(self, base: dict[str, str], created: float, out: list[str]) -> None:
        """Append this histogram's exposition lines, then its `_created` gauge as vLLM exposes it."""
        name = self.name
        out.append(f"# HELP {name} {self.doc}")
        out.append(f"# TYPE {name} histogram")
        acc = 0
        for b, c in zip(self.bounds, self.counts, strict=False):
            acc += c
            out.append(f"{name}_bucket{{{_labels(base, le=_fmt(b))}}} {_fmt(acc)}")
        out.append(f'{name}_bucket{{{_labels(base, le="+Inf")}}} {_fmt(self.count)}')
        lb = _labels(base)
        out.append(f"{name}_count{{{lb}}} {_fmt(self.count)}")
        out.append(f"{name}_sum{{{lb}}} {_fmt(self.sum)}")
        out.append(f"# HELP {name}_created {self.doc}")
        out.append(f"# TYPE {name}_created gauge")
        out.append(f"{name}_created{{{lb}}} {_fmt(created)}")


class EngineMetrics:
    """Token counters and latency histograms the engine feeds; queue and cache gauges are read at scrape time."""

    def __init__(self, model_name: str, engine: int = 0, max_model_len: int = 2048) -> None:
        self.base = {"engine": str(engine), "model_name": model_name}
        self.created = time.time()
        self.prompt_tokens = 0
        self.prompt_tokens_cached = 0
        self.generation_tokens = 0
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.lateness_s = 0.0  # sim-only: how far steps ran past their modeled end (CPU saturation)
        self.modeled_s = 0.0
        self.ttft = Histogram("vllm:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.itl = Histogram("vllm:inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.tpot = Histogram("vllm:request_time_per_output_token_seconds",
                              "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS)
        self.queue = Histogram("vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.",
                               REQUEST_LATENCY_BUCKETS)
        self.inference = Histogram("vllm:request_inference_time_seconds",
                                   "Histogram of time spent in RUNNING phase for request.",
                                   REQUEST_LATENCY_BUCKETS)
        self.prefill = Histogram("vllm:request_prefill_time_seconds",
                                 "Histogram of time spent in PREFILL phase for request.",
                                 REQUEST_LATENCY_BUCKETS)
        self.decode = Histogram("vllm:request_decode_time_seconds",
                                "Histogram of time spent in DECODE phase for request.",
                                REQUEST_LATENCY_BUCKETS)
        tok = request_tokens_buckets(max_model_len)
        self.req_prompt = Histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tok)
        self.req_gen = Histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", tok)
        self.req_max_tokens = Histogram("vllm:request_params_max_tokens",
                                        "Histogram of the max_tokens request parameter.", tok)
        self.req_kv_computed = Histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            tok,
        )
        self.iteration = Histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                                   ITERATION_TOKENS_BUCKETS)
        self.req_preemptions = Histogram("vllm:request_num_preemptions",
                                         "Histogram of the number of times a request was preempted.",
                                         REQUEST_NUM_PREEMPTIONS_BUCKETS)

    def histograms(self) -> tuple[Histogram, ...]:
        """All histograms in exposition order."""
        return (self.req_prompt, self.req_gen, self.iteration, self.req_max_tokens, self.ttft, self.itl, self.tpot,
                self.e2e, self.queue, self.inference, self.prefill, self.decode, self.req_preemptions,
                self.req_kv_computed)

    def render(self, sched: Scheduler, *, spec_enabled: bool, cache_info: dict[str, str]) -> str:
        """Prometheus text as vLLM 0.32 exposes it: counters as `<name>_total` families with `_created` gauges."""
        base = self.base
        lb = _labels(base)
        out: list[str] = []
        c = sched.counters
        created = _fmt(self.created)

        def gauge(name: str, doc: str, value: float) -> None:
            out.append(f"# HELP {name} {doc}")
            out.append(f"# TYPE {name} gauge")
            out.append(f"{name}{{{lb}}} {_fmt(value)}")

        def counter(name: str, doc: str, values: dict[str, float], label: str = "") -> None:
            # values: label value -> count ("" when the counter has no extra label)
            out.append(f"# HELP {name}_total {doc}")
            out.append(f"# TYPE {name}_total counter")
            for key, v in values.items():
                out.append(f"{name}_total{{{_labels(base, **({label: key} if label else {}))}}} {_fmt(v)}")
            out.append(f"# HELP {name}_created {doc}")
            out.append(f"# TYPE {name}_created gauge")
            for key in values:
                out.append(f"{name}_created{{{_labels(base, **({label: key} if label else {}))}}} {created}")

        if spec_enabled:
            counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", {"": c.spec_drafts})
            counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", {"": c.spec_draft_tokens})
            counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", {"": c.spec_accepted})
            counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                    {str(i): n for i, n in enumerate(c.spec_accepted_per_pos)}, "position")
        gauge("vllm:num_requests_running", "Number of requests in model execution batches.", len(sched.running))
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", len(sched.waiting))
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", sched.pool.usage())
        counter("vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.", {"": c.prefix_queries})
        counter("vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.", {"": c.prefix_hits})
        counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", {"": c.preemptions})
        counter("vllm:prompt_tokens", "Number of prefill tokens processed.", {"": self.prompt_tokens})
        counter("vllm:prompt_tokens_cached",
                "Number of cached prompt tokens (local + external).", {"": self.prompt_tokens_cached})
        counter("vllm:generation_tokens", "Number of generation tokens processed.", {"": self.generation_tokens})
        counter("vllm:request_success", "Count of successfully processed requests.",
                dict(self.success), "finished_reason")
        for h in self.histograms():
            h.render(base, self.created, out)
        out.append("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig")
        out.append("# TYPE vllm:cache_config_info gauge")
        out.append(f"vllm:cache_config_info{{{_labels(base, **cache_info)}}} 1.0")
        out.append("# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.")
        out.append("# TYPE process_cpu_seconds_total counter")
        out.append(f"process_cpu_seconds_total {_fmt(time.process_time())}")
        gauge("kvgate_sim_steps", "Sim only: engine steps run.", c.steps)
        gauge("kvgate_sim_step_lateness_seconds",
              "Sim only: total time steps ran past their modeled end (host CPU saturation).",
              self.lateness_s)
        gauge("kvgate_sim_modeled_step_seconds", "Sim only: total modeled step time.", self.modeled_s)
        return "\n".join(out) + "\n"
