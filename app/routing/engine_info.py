"""What a vLLM replica publishes about itself, read rather than configured: one typed record per replica.

Sources (vLLM 0.32, checked against its sources and two real vLLM-CPU scrapes in tests/routing/fixtures):
- `/metrics` `vllm:cache_config_info{...}` (vllm/v1/metrics/loggers.py logs CacheConfig as labels):
  `block_size`, `prefix_caching_hash_algo`, `enable_prefix_caching`, `num_gpu_blocks`. `kvgate sim` adds
  `max_num_seqs` there, a label a real vLLM lacks (it shows `--max-num-seqs` nowhere outside dev mode).
- `/metrics` `vllm:spec_decode_*`: registered only when the engine runs a speculative config, from start-up
  on (zero-valued until the first draft); `..._per_pos{position}` has one series per speculative token.
  vLLM publishes no method label: `spec_method` stays None unless a source says it.
- `/v1/models`: `max_model_len` of the served model.
- `/version`: the version string (vLLM-CPU 0.32 says `0.32.0` as the GPU build does: nothing a replica
  publishes says it runs on CPU, so `top_k`, which crashes vLLM-CPU 0.32's ngram path, stays a config entry).

`None` means "not published (yet)": the config's value, or the built-in default, stands. The record is
replaced whole on each read (frozen): pick and the hashers read it without locks.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

CACHE_CONFIG_INFO: Final = "vllm:cache_config_info{"
SPEC_SERIES: Final = "vllm:spec_decode_num_drafts"
SPEC_PER_POS: Final = "vllm:spec_decode_num_accepted_tokens_per_pos_total{"
# What vLLM's speculative path refuses: "The min_p and logit_bias sampling parameters are not yet supported
# with speculative decoding" (vllm/v1/engine/processor.py, 0.32).
SPECULATIVE_UNSUPPORTED: Final = ("min_p", "logit_bias")

_LABEL_RX = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """Engine facts of one replica; a field is None until the replica published it."""

    block_size: int | None = None
    hash_algo: str | None = None
    prefix_caching: bool | None = None
    num_gpu_blocks: int | None = None
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    speculative: bool | None = None
    spec_tokens: int | None = None
    spec_method: str | None = None
    tool_parser: str | None = None
    version: str | None = None

    def merged(self, newer: EngineInfo) -> EngineInfo:
        """This record with every field `newer` publishes replaced by its value."""
        changes = {f.name: v for f in dataclasses.fields(newer) if (v := getattr(newer, f.name)) is not None}
        return dataclasses.replace(self, **changes) if changes else self

    def unsupported_params(self) -> tuple[str, ...]:
        """Request fields this engine refuses, derived from what it runs (empty when it does not speculate)."""
        return SPECULATIVE_UNSUPPORTED if self.speculative else ()

    def facts(self) -> dict[str, Any]:
        """The published fields (for logs and `check-config --probe`)."""
        return {f.name: v for f in dataclasses.fields(self) if (v := getattr(self, f.name)) is not None}


def info_labels(text: str, prefix: str) -> dict[str, str] | None:
    """The labels of the first sample line that starts with `prefix` (`name{`), or None when there is none."""
    at = text.find("\n" + prefix)
    if at < 0:
        if not text.startswith(prefix):
            return None
        at = 0
    else:
        at += 1
    end = text.find("\n", at)
    line = text[at : end if end >= 0 else len(text)]
    return {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL_RX.findall(line, len(prefix) - 1)}


def _int(labels: Mapping[str, str], key: str) -> int | None:
    try:
        value = int(labels.get(key, ""))
    except ValueError:
        return None
    return value if value > 0 else None


def _bool(labels: Mapping[str, str], key: str) -> bool | None:
    value = labels.get(key)
    return None if value is None else value.lower() == "true"


def from_metrics(text: str) -> EngineInfo:
    """What one /metrics scrape says; a scrape with vLLM series but no spec_decode ones says "not speculative"."""
    cache = info_labels(text, CACHE_CONFIG_INFO) or {}
    algo = cache.get("prefix_caching_hash_algo")
    speculative: bool | None = None
    spec_tokens: int | None = None
    if SPEC_SERIES in text:
        speculative = True
        positions = text.count("\n" + SPEC_PER_POS)
        spec_tokens = positions or None
    elif "vllm:" in text:
        speculative = False
    return EngineInfo(
        block_size=_int(cache, "block_size"),
        hash_algo=algo if algo and algo != "None" else None,
        prefix_caching=_bool(cache, "enable_prefix_caching"),
        num_gpu_blocks=_int(cache, "num_gpu_blocks"),
        max_num_seqs=_int(cache, "max_num_seqs"),
        speculative=speculative,
        spec_tokens=spec_tokens,
    )


def from_models(body: Any, served_model: str) -> EngineInfo:
    """`max_model_len` of `served_model` from a /v1/models body (a dict), when the replica lists it."""
    data = body.get("data") if isinstance(body, dict) else None
    for card in data if isinstance(data, list) else ():
        if isinstance(card, dict) and card.get("id") == served_model:
            n = card.get("max_model_len")
            return EngineInfo(max_model_len=n if isinstance(n, int) and n > 0 else None)
    return EngineInfo()


def from_version(body: Any) -> EngineInfo:
    """The version string of a /version body."""
    v = body.get("version") if isinstance(body, dict) else None
    return EngineInfo(version=v if isinstance(v, str) and v else None)
