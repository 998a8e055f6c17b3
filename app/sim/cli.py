"""`kvgate sim`: run one simulated vLLM replica."""

from __future__ import annotations

import argparse

from app.sim.options import SimOptions, SpecConfig
from app.sim.profiles import PROFILES


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Add the sim's flags to `p`."""
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default="sim", help="served model name (what clients send as `model`)")
    p.add_argument("--profile", default="h100-8b", choices=sorted(PROFILES), help="step-time model")
    p.add_argument("--max-num-seqs", type=int, default=None, help="default: the profile's")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="default: the profile's")
    p.add_argument("--kv-blocks", type=int, default=None, help="KV blocks of 16 tokens; default: the profile's")
    p.add_argument("--block-size", type=int, default=None, help="tokens per KV block; default: the profile's")
    p.add_argument("--max-model-len", type=int, default=None, help="default: the profile's")
    p.add_argument("--speculative", default=None, metavar="ngram:K:ACCEPT[:DRAFT]",
                   help="speculative decoding: K draft tokens, each accepted with probability ACCEPT; "
                        "DRAFT (default 1) = share of steps where the proposer has a draft")  # fmt: skip
    p.add_argument("--time-scale", type=float, default=1.0, help="run the clock X times faster")
    p.add_argument("--tokenizer", default=None, metavar="PATH",
                   help="a model folder (tokenizer.json + chat template: chat prompts tokenized as the gateway "
                        "predicts them) or a tokenizer.json (default: built-in scheme)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-trace", action="store_true",
                   help="record every engine step and each request's first token; GET /sim/step_trace returns them")
    p.add_argument("--scheduling-policy", choices=["fcfs", "priority"], default="fcfs")
    p.add_argument("--publish-max-num-seqs", action="store_true",
                   help="add max_num_seqs to vllm:cache_config_info (vLLM 0.32 publishes it nowhere)")
    p.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false")
    p.add_argument("--no-enable-prompt-tokens-details", dest="enable_prompt_tokens_details",
                   action="store_false", help="omit usage.prompt_tokens_details (vLLM's default)")  # fmt: skip
    p.add_argument("--mean-output-tokens", type=int, default=256, help="mean natural length without ignore_eos")
    p.add_argument("--no-default-system-prompt", dest="default_system_prompt", action="store_false",
                   help="do not insert SmolLM2's default system turn")  # fmt: skip
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="accept tools with tool_choice auto (as vLLM; needs --tool-call-parser too)")  # fmt: skip
    p.add_argument("--tool-call-parser", default=None, help="accepted as in vLLM (e.g. hermes)")
    p.add_argument("--no-render-tools", dest="render_tools", action="store_false",
                   help="drop `tools` from the prompt, as SmolLM2's own chat template does")  # fmt: skip
    p.add_argument("--enable-responses-store", action="store_true",
                   help="keep /v1/responses results for GET, cancel, previous_response_id and background mode "
                        "(vLLM: VLLM_ENABLE_RESPONSES_API_STORE=1)")  # fmt: skip
    p.add_argument("--prefix-caching-hash-algo", choices=["sha256_cbor", "sha256"], default="sha256_cbor",
                   help="block hash as vLLM computes it (sha256_cbor: reproducible outside Python)")  # fmt: skip
    p.add_argument("--kv-events", default=None, metavar="ENDPOINT",
                   help="publish vLLM KV-cache events on this ZMQ PUB endpoint (tcp://*:5557 binds, "
                        "tcp://host:port connects, as vLLM's --kv-events-config endpoint)")  # fmt: skip
    p.add_argument("--kv-replay", default=None, metavar="ENDPOINT",
                   help="ROUTER endpoint answering replay requests (vLLM's replay_endpoint), e.g. tcp://*:5558")
    p.add_argument("--kv-topic", default="", help="topic frame of every KV-event message (vLLM's topic)")
    p.add_argument("--kv-buffer-steps", type=int, default=10_000, help="event batches kept for replay")
    p.add_argument("--no-enable-scale-out", dest="enable_scale_out", action="store_false",
                   help="answer the render endpoints 403, as vLLM does without --enable-scale-out")  # fmt: skip
    p.add_argument("--fail-marker", default=None, metavar="TEXT",
                   help="answer 500 to every POST whose body contains TEXT (a deterministic per-body fault)")
    p.add_argument("--log-level", default="warning")


def options_from_args(args: argparse.Namespace) -> SimOptions:
    """SimOptions from parsed flags (validates them)."""
    if args.speculative:
        SpecConfig.parse(args.speculative)
    opts = SimOptions(
        model=args.model,
        profile=args.profile,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_blocks=args.kv_blocks,
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        speculative=args.speculative,
        time_scale=args.time_scale,
        step_trace=args.step_trace,
        tokenizer=args.tokenizer,
        seed=args.seed,
        scheduling_policy=args.scheduling_policy,
        enable_prefix_caching=args.enable_prefix_caching,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        mean_output_tokens=args.mean_output_tokens,
        default_system_prompt=args.default_system_prompt,
        render_tools=args.render_tools,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        tool_call_parser=args.tool_call_parser,
        enable_responses_store=args.enable_responses_store,
        prefix_caching_hash_algo=args.prefix_caching_hash_algo,
        kv_events=args.kv_events,
        kv_replay=args.kv_replay,
        kv_topic=args.kv_topic,
        kv_buffer_steps=args.kv_buffer_steps,
        enable_scale_out=args.enable_scale_out,
        fail_marker=args.fail_marker,
        publish_max_num_seqs=args.publish_max_num_seqs,
    )
    opts.scheduler_config()
    opts.hash_algo()
    opts.validate_kv_events()
    return opts


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; returns the exit code."""
    import uvicorn

    from app.sim.server import create_sim_app

    try:
        opts = options_from_args(args)
    except ValueError as e:
        print(f"kvgate sim: {e}")
        return 2
    uvicorn.run(
        create_sim_app(opts),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        loop="uvloop",
        http="httptools",
        timeout_keep_alive=30,
        backlog=4096,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry: `python -m app.sim.cli ...`."""
    p = argparse.ArgumentParser(prog="kvgate sim", description=__doc__)
    configure_parser(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
