"""`kvgate bench`: argument parsing and the terminal/JSON/PNG outputs around run_bench."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

from app.bench.apis import API_NAMES
from app.bench.plot import plot_result
from app.bench.pricing import PriceConfigError, load_pricing
from app.bench.report import BenchResult, sweep_json
from app.bench.runner import run_bench, run_sweep
from app.bench.spec import BenchSpec, Pricing
from app.bench.table import print_table
from app.bench.workloads import WORKLOADS


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("give an integer or a comma-separated list, e.g. 1,8,32,128") from None
    if not levels or any(n < 1 for n in levels):
        raise argparse.ArgumentTypeError("concurrency levels must be ≥ 1")
    return levels


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise argparse.ArgumentTypeError("not valid JSON") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _positive(kind: type[int] | type[float]):  # type: ignore[no-untyped-def]
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError("must be > 0")
        return value

    return parse


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Add the bench's arguments to `p`."""
    target = p.add_argument_group("target")
    target.add_argument("--base-url", required=True, action="append",
                        help="OpenAI-compatible URL (gateway, kvgate sim, vLLM); repeat it for several gateway "
                        "processes: sessions are spread over them, each session on one")
    target.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                        help="API key for one tenant (default: $OPENAI_API_KEY)")
    target.add_argument("--api-keys", default=None, help="comma-separated keys; sessions spread over them")
    target.add_argument("--tenants", type=_positive(int), default=1,
                        help="tenants when no --api-keys: keys sk-bench-tenant-<i>")
    target.add_argument("--model", default=None, help="model name (default: first id from GET /v1/models)")
    target.add_argument("--time-scale", type=_positive(float), default=1.0,
                        help="the target's clock runs X times faster (kvgate sim --time-scale X): "
                             "durations are reported in its time")
    target.add_argument("--timeout", type=_positive(float), default=300.0, help="per-request timeout, s")

    load = p.add_argument_group("workload and load")
    load.add_argument("--workload", choices=WORKLOADS, default="chat")
    load.add_argument("--api", choices=API_NAMES, default="chat",
                      help="send the workload as chat completions, Responses (/v1/responses) or Anthropic "
                           "Messages (/v1/messages); usage and cached tokens come from that API's own fields")
    load.add_argument("--no-volatile", action="store_true",
                      help="agent without its volatile header and with fixed tool order (= agent-static)")
    shape = load.add_mutually_exclusive_group()
    shape.add_argument("--concurrency", type=_levels, default=[8],
                       help="closed-loop concurrency; a list (1,8,32,128) runs a sweep")
    shape.add_argument("--rate", type=_positive(float), default=None, help="open loop: Poisson arrivals, req/s")
    bound = load.add_mutually_exclusive_group()
    bound.add_argument("--requests", type=_positive(int), default=None,
                       help="requests per run (default max(50, 4 x concurrency))")
    bound.add_argument("--duration", type=_positive(float), default=None, help="seconds of issuing per run")
    load.add_argument("--warmup", type=int, default=0,
                      help="send N requests first and leave them out of the summary (on top of --requests)")
    load.add_argument("--seed", type=int, default=0)
    load.add_argument("--max-tokens", type=_positive(int), default=None, help="override the workload's max_tokens")
    load.add_argument("--mixed-ratio", type=float, default=0.8, help="mixed: share of interactive sessions")
    load.add_argument("--prompt-tokens", type=_positive(int), default=256,
                      help="synthetic: prompt length in tokens (with --max-tokens and ignore_eos: fixed shapes)")
    load.add_argument("--tokenizer", default=None,
                      help="synthetic: tokenizer.json or a folder holding one, to size prompts exactly "
                           "(default: ~4 characters per token)")
    load.add_argument("--class-header", default="x-kvgate-class", help="mixed: header carrying the class")
    load.add_argument("--tool-choice", choices=["none", "auto", "omit"], default="none",
                      help="agent: tool_choice to send (none works on engines without tool parsing; "
                           "the tools still reach the prompt)")
    load.add_argument("--no-stream", action="store_true", help="non-streaming requests (TTFT = E2E)")
    load.add_argument("--extra-body", type=_json_object, default={},
                      help='JSON merged into every request body, e.g. \'{"ignore_eos": true}\' for vLLM')

    slo = p.add_argument_group("SLOs and prices")
    slo.add_argument("--slo-ttft-ms", type=_positive(float), default=None)
    slo.add_argument("--slo-tpot-ms", type=_positive(float), default=None)
    slo.add_argument("--price-config", default=None,
                     help="YAML: a gateway config (pools.<pool>.price, tenants[].reference_price) or "
                          "{price: {...}, reference_price: {...}}")
    slo.add_argument("--pool", default=None, help="pool whose price to use from a gateway config")
    slo.add_argument("--tenant", default=None, help="tenant whose reference_price to use")
    slo.add_argument("--gpu-hour-usd", type=float, default=None, help="overrides the price config")
    slo.add_argument("--gpus", type=_positive(int), default=None, help="overrides the price config")

    out = p.add_argument_group("output")
    out.add_argument("--json", dest="json_out", default=None, help="write results (with per-request records)")
    out.add_argument("--json-summary-only", action="store_true", help="leave per-request records out of --json")
    out.add_argument("--plot", default=None, help="write a PNG (a sweep: percentiles/throughput vs concurrency)")
    out.add_argument("--quiet", action="store_true", help="no progress bar")


def spec_from_args(args: argparse.Namespace) -> BenchSpec:
    """The BenchSpec the parsed arguments describe (first concurrency level)."""
    pricing = load_pricing(args.price_config, args.pool, args.tenant) if args.price_config else Pricing()
    if args.gpu_hour_usd is not None:
        pricing = replace(pricing, gpu_hour_usd=args.gpu_hour_usd)
    if args.gpus is not None:
        pricing = replace(pricing, gpus=args.gpus)
    workload = "agent-static" if args.no_volatile and args.workload == "agent" else args.workload
    keys = tuple(k.strip() for k in args.api_keys.split(",") if k.strip()) if args.api_keys else ()
    return BenchSpec(
        base_url=args.base_url[0], more_base_urls=tuple(args.base_url[1:]), workload=workload, api=args.api,
        model=args.model, api_key=args.api_key, api_keys=keys,
        tenants=args.tenants, concurrency=args.concurrency[0], rate=args.rate, requests=args.requests,
        warmup=max(args.warmup, 0),
        duration_s=args.duration, seed=args.seed, max_tokens=args.max_tokens, mixed_ratio=args.mixed_ratio,
        class_header=args.class_header, tool_choice=args.tool_choice, stream=not args.no_stream, timeout_s=args.timeout,
        prompt_tokens=args.prompt_tokens, tokenizer=args.tokenizer,
        extra_body=args.extra_body, time_scale=args.time_scale, slo_ttft_ms=args.slo_ttft_ms,
        slo_tpot_ms=args.slo_tpot_ms, pricing=pricing,
        progress=not args.quiet and sys.stderr.isatty(),
    )


def run(args: argparse.Namespace) -> int:
    """Run `kvgate bench`; 0 when every request succeeded, 1 when some failed, 2 on bad input."""
    err = Console(stderr=True)
    if not 0 <= args.mixed_ratio <= 1:
        err.print("kvgate bench: --mixed-ratio must be within 0..1")
        return 2
    try:
        spec = spec_from_args(args)
    except PriceConfigError as e:
        err.print(f"kvgate bench: {e}")
        return 2
    levels: list[int] = args.concurrency if args.rate is None else [spec.concurrency]
    try:
        results: list[BenchResult] = asyncio.run(run_sweep(spec, levels) if len(levels) > 1 else _single(spec))
    except RuntimeError as e:  # e.g. no model listed
        err.print(f"kvgate bench: {e}")
        return 2
    except KeyboardInterrupt:
        return 130
    print_table(results)
    if args.json_out:
        records = not args.json_summary_only
        text = results[0].to_json(records=records) if len(results) == 1 else sweep_json(results, records=records)
        Path(args.json_out).write_text(text)
    if args.plot:
        plot_result(results, args.plot)
    return 0 if all(r.summary.errors == 0 for r in results) else 1


async def _single(spec: BenchSpec) -> list[BenchResult]:
    return [await run_bench(spec)]


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (`python -m app.bench.cli`), for use before the lead's CLI wires `bench` in."""
    parser = argparse.ArgumentParser(prog="kvgate bench", description="Benchmark an OpenAI-compatible endpoint.")
    configure_parser(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
