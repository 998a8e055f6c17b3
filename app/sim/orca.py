"""The ORCA `endpoint-load-metrics` reply header, built as vLLM 0.32 builds it
(vllm/entrypoints/serve/utils/orca_metrics.py: create_orca_header over get_named_metrics_from_prometheus).

vLLM sends it on a non-streaming chat or completions reply whose request asked with
`endpoint-load-metrics-format: TEXT` or `JSON`; the named metrics are its gauges `vllm:num_requests_waiting`
then `vllm:kv_cache_usage_perc`, floats, at the moment the reply is built. Any other format gets no header.
"""

from __future__ import annotations

import json


def orca_header(metrics_format: str, waiting: int, kv_usage: float) -> bytes | None:
    """The header's value for the asked format, or None when vLLM would send none."""
    named = [("num_requests_waiting", float(waiting)), ("kv_cache_usage_perc", float(kv_usage))]
    fmt = metrics_format.lower()
    if fmt == "text":
        return ("TEXT " + ", ".join(f"named_metrics.{k}={v}" for k, v in named)).encode()
    if fmt == "json":
        # json.dumps with its default separators: the exact bytes vLLM sends.
        return ("JSON " + json.dumps({"named_metrics": dict(named)})).encode()
    return None
