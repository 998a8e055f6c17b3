"""`kvgate serve | bench | sim | check-config`."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from app.config import ConfigError, load_config


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.api.app import create_app

    try:
        cfg = load_config(args.config)
    except ConfigError as err:
        _print_problems(err)
        return 2
    host = args.host or cfg.listen.host
    port = args.port if args.port is not None else cfg.listen.port
    uvicorn.run(
        create_app(cfg),
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        # The gateway reads no client address; skipping uvicorn's proxy-headers layer saves work per request.
        proxy_headers=False,
        log_level=args.log_level,
        timeout_graceful_shutdown=5,
    )
    return 0


def _check_config(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.path)
    except ConfigError as err:
        _print_problems(err)
        return 2
    pools = ", ".join(f"{n} ({p.role}, {len(p.replicas)} replica(s))" for n, p in cfg.pools.items())
    print(f"ok: {len(cfg.models)} model(s), pools: {pools}, {len(cfg.tenants)} tenant(s)")
    return 0


def _print_problems(err: ConfigError) -> None:
    for problem in err.problems:
        print(problem, file=sys.stderr)


def _delegate(module: str) -> tuple[object, object]:
    mod = importlib.import_module(module)
    return mod.configure_parser, mod.run


def build_parser() -> argparse.ArgumentParser:
    """The CLI's argument parser."""
    parser = argparse.ArgumentParser(prog="kvgate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help="config file (default: KVGATE_CONFIG or the embedded config/local.yaml)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--log-level", default="warning")
    serve.set_defaults(func=_serve)

    check = sub.add_parser("check-config", help="validate a config file; exit 2 with every problem")
    check.add_argument("path", nargs="?")
    check.set_defaults(func=_check_config)

    helps = {"bench": "load-test an OpenAI-compatible URL: TTFT, TPOT, throughput, $/M tokens",
             "sim": "emulate a vLLM server (batching, paged KV with prefix caching, speculative decoding)"}
    for name, module in (("bench", "app.bench.cli"), ("sim", "app.sim.cli")):
        configure, run = _delegate(module)
        p = sub.add_parser(name, help=helps[name])
        configure(p)  # type: ignore[operator]
        p.set_defaults(func=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `kvgate` console script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
