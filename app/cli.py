"""`kvgate serve | bench | sim | check-config`."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.metadata
import re
import socket
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

import uvicorn

from app.api.server import Drainable, GatewayServer
from app.config import ConfigError, GatewayConfig, load_config
from app.normalize.salt import salt_secret_problem

if TYPE_CHECKING:
    from app.workers import WorkerInfo

# The lab commands: module and help line. Each needs the optional extra of its own name (pyproject.toml).
LAB_COMMANDS = {
    "bench": ("app.bench.cli", "load-test an OpenAI-compatible URL: TTFT, TPOT, throughput, $/M tokens"),
    "sim": ("app.sim.cli", "emulate a vLLM server (batching, paged KV with prefix caching, speculative decoding)"),
}
# How long the ready line waits for every replica's first health probe (a probe times out within 5 s).
_FIRST_PROBE_WAIT_S = 5.0
_PROBE_POLL_S = 0.05
# How often a gateway that is listening but not ready checks whether every model has a healthy replica.
_READY_POLL_S = 1.0
_EXTRA_RX = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
_NAME_RX = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _serve(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.config)
    except ConfigError as err:
        _print_problems(err)
        return 2
    host = args.host or cfg.listen.host
    port = args.port if args.port is not None else cfg.listen.port
    problem = salt_secret_problem(cfg.normalize.salt_secret, host)
    if problem is not None:
        print(f"kvgate: {problem}", file=sys.stderr)
        return 2
    workers = args.workers if args.workers is not None else cfg.listen.workers
    if workers != 1:
        from app.workers import serve_workers  # N processes on one port (SO_REUSEPORT), each the path below

        return serve_workers(serve_app, cfg, args.config, host, port, args.log_level, workers)
    return serve_app(cfg, host, port, args.log_level)


def serve_app(cfg: GatewayConfig, host: str, port: int, log_level: str, *, sock: socket.socket | None = None,
              worker: WorkerInfo | None = None) -> int:
    """One gateway process on host:port, or on `sock` as one of `kvgate serve --workers N` (app/workers.py)."""
    from app.api.app import create_app
    from app.api.server import server_config

    app = create_app(cfg)
    if worker is not None:
        worker.attach(app)
    config = server_config(
        app,
        cfg.listen,
        app.connections,
        host=host,
        port=port,
        loop="uvloop",
        access_log=False,
        # The gateway reads no client address; skipping uvicorn's proxy-headers layer saves work per request.
        proxy_headers=False,
        log_level=log_level,
    )
    server = _ReadyServer(config, app, cfg, lambda url: _announce_when_probed(url, cfg, app, worker))
    server.run(sockets=None if sock is None else [sock])
    # uvicorn's own exit code for a server that never started (port taken, lifespan failed).
    return 0 if server.started else 3


class _ReadyServer(GatewayServer):
    """The gateway's server (slow-client deadlines, drain), plus one task started once the sockets listen."""

    def __init__(
        self,
        config: uvicorn.Config,
        app: Drainable,
        cfg: GatewayConfig,
        on_started: Callable[[str], Coroutine[Any, Any, None]],
    ) -> None:
        super().__init__(config, app, cfg.listen)
        self._on_started = on_started
        self._ready_task: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Bind and run the app's lifespan as uvicorn does, then announce the listening address."""
        await super().startup(sockets)
        if self.started and not self.should_exit:
            self._ready_task = asyncio.create_task(self._on_started(_listen_url(self.servers)))


def _listen_url(servers: Sequence[Any]) -> str:
    try:
        host, port = servers[0].sockets[0].getsockname()[:2]
    except (IndexError, AttributeError, TypeError, ValueError):
        return "(unknown address)"
    return f"http://[{host}]:{port}" if ":" in str(host) else f"http://{host}:{port}"


async def _announce_when_probed(url: str, cfg: GatewayConfig, app: object, worker: WorkerInfo | None = None) -> None:
    """Print the ready line once every replica had its first probe (or after a few seconds); of N workers,
    worker 0 prints it."""
    if worker is not None:
        worker.on_listening()
        if worker.index != 0:
            return
    replicas = _replica_states(app)
    # The scraper sets no event on a first probe; a bounded poll of the flags it does set is enough here.
    for _ in range(int(_FIRST_PROBE_WAIT_S / _PROBE_POLL_S)):
        # Probed, and a healthy one's engine facts read (/v1/models, /version right after its first /metrics).
        if all(_first_probe_done(r) for _, r in replicas):
            break
        await asyncio.sleep(_PROBE_POLL_S)
    workers = f" - {worker.count} workers" if worker is not None else ""
    waiting = _unready_models(app)
    if waiting:
        # Listening is not ready: /ready says 503 until every model has a healthy replica; say which wait.
        print(f"kvgate listening on {url}, not ready: no healthy replica for model(s) {', '.join(waiting)}"
              f" - pools {_pools_line(cfg, replicas)}{workers}", flush=True)
        # Health probes set no event; polling the gateway's own answer once a second is enough for one line.
        while _unready_models(app):  # noqa: ASYNC110
            await asyncio.sleep(_READY_POLL_S)
    print(ready_line(url, cfg, _replica_states(app)) + workers, flush=True)
    from app.engine_report import startup_lines

    for line in startup_lines(getattr(getattr(getattr(app, "api", app), "state", None), "gateway", None)):
        print(line, flush=True)


def _unready_models(app: object) -> list[str]:
    """Models with no healthy replica yet (none when the app has no gateway state to ask)."""
    gateway = getattr(getattr(getattr(app, "api", app), "state", None), "gateway", None)
    unready = getattr(gateway, "unready_models", None)
    return list(unready()) if callable(unready) else []


def _first_probe_done(r: Any) -> bool:
    return bool(getattr(r, "probed", True) and (getattr(r, "engine_read", True) or not getattr(r, "healthy", False)))


def _replica_states(app: object) -> list[tuple[str, Any]]:
    """(pool, replica state) pairs from the running gateway; empty if its shape is not the expected one."""
    state = getattr(getattr(app, "api", app), "state", None)
    cluster = getattr(getattr(state, "gateway", None), "cluster", None)
    pools = getattr(cluster, "pools", None)
    if not isinstance(pools, dict):
        return []
    return [(name, r) for name, pool in pools.items() for r in getattr(pool, "replicas", ())]


def ready_line(url: str, cfg: GatewayConfig, replicas: Sequence[tuple[str, Any]]) -> str:
    """`kvgate ready on URL - pools fast (1/1 replicas healthy), ...`; counts from the config if no state."""
    return f"kvgate ready on {url} - pools {_pools_line(cfg, replicas)}"


def _pools_line(cfg: GatewayConfig, replicas: Sequence[tuple[str, Any]]) -> str:
    parts = []
    for name, pool in cfg.pools.items():
        total = len(pool.replicas)
        states = [r for p, r in replicas if p == name]
        if not states:
            parts.append(f"{name} ({total} replica{'s' if total != 1 else ''})")
            continue
        healthy = sum(1 for r in states if getattr(r, "probed", False) and _available(r))
        unprobed = sum(1 for r in states if not getattr(r, "probed", False))
        note = f", {unprobed} not probed yet" if unprobed else ""
        parts.append(f"{name} ({healthy}/{len(states)} replica{'s' if len(states) != 1 else ''} healthy{note})")
    return ", ".join(parts)


def _available(replica: Any) -> bool:
    available = getattr(replica, "available", None)
    return bool(available()) if callable(available) else bool(getattr(replica, "healthy", False))


def _check_config(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.path)
    except ConfigError as err:
        _print_problems(err)
        return 2
    pools = ", ".join(f"{n} ({p.role}, {_replicas_said(p)})" for n, p in cfg.pools.items())
    print(f"ok: {len(cfg.models)} model(s), pools: {pools}, {len(cfg.tenants)} tenant(s)")
    if args.probe:  # what each replica publishes, what the config overrides, what disagrees
        from app.engine_report import probe

        for line in asyncio.run(probe(cfg)):
            print(line)
    return 0


def _replicas_said(pool: Any) -> str:
    d = pool.discovery
    if d is None:
        return f"{len(pool.replicas)} replica(s)"
    return f"replicas from dns {d.dns}" if d.dns else f"replicas from endpointslices {d.kubernetes.label_selector}"


def _print_problems(err: ConfigError) -> None:
    for problem in err.problems:
        print(problem, file=sys.stderr)


def missing_extra(extra: str) -> list[str]:
    """Distributions of kvgate's optional `extra` that are not installed (empty when kvgate has no metadata)."""
    try:
        requires = importlib.metadata.requires("kvgate") or []
    except importlib.metadata.PackageNotFoundError:
        return []
    missing = []
    for req in requires:
        spec, _, marker = req.partition(";")
        name = _NAME_RX.match(spec)
        if name is None or extra not in _EXTRA_RX.findall(marker) or name.group(1) == "kvgate":
            continue
        try:
            importlib.metadata.distribution(name.group(1))
        except importlib.metadata.PackageNotFoundError:
            missing.append(name.group(1))
    return missing


def _missing_extra_message(command: str, missing: Sequence[str]) -> str:
    return (f"kvgate {command} needs the '{command}' extra (missing: {', '.join(missing)}); "
            f"install it with: pip install 'kvgate[{command}]'")


def _needs_extra(command: str, missing: Sequence[str]) -> Callable[[argparse.Namespace], int]:
    def run(_args: argparse.Namespace) -> int:
        print(_missing_extra_message(command, missing), file=sys.stderr)
        return 2

    return run


def _load_lab_command(name: str) -> tuple[Any, list[str]]:
    """The lab command's module, or None and the distributions its extra still needs."""
    missing = missing_extra(name)
    if missing:
        return None, missing
    try:
        return importlib.import_module(LAB_COMMANDS[name][0]), []
    except ModuleNotFoundError as err:  # kvgate run from a checkout without its metadata
        if (err.name or "app").split(".")[0] == "app":
            raise
        return None, [err.name or "?"]


def _add_lab_command(sub: Any, name: str, load: bool) -> None:
    p = sub.add_parser(name, help=LAB_COMMANDS[name][1])
    if not load:  # not the command being run: its help line is enough
        return
    mod, missing = _load_lab_command(name)
    if mod is None:
        p.set_defaults(func=_needs_extra(name, missing))
        return
    mod.configure_parser(p)
    p.set_defaults(func=mod.run)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI's argument parser; lab commands other than `command` are not imported (all when None)."""
    parser = argparse.ArgumentParser(prog="kvgate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help="config file (default: KVGATE_CONFIG or the embedded config/local.yaml)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--log-level", default="warning")
    serve.add_argument("--workers", type=int, help="processes on one port (default: listen.workers); >1 needs Redis")
    serve.set_defaults(func=_serve)

    check = sub.add_parser("check-config", help="validate a config file; exit 2 with every problem")
    check.add_argument("path", nargs="?")
    check.add_argument("--probe", action="store_true",
                       help="also probe every replica: what it publishes, what the config overrides or contradicts")
    check.set_defaults(func=_check_config)

    for name in LAB_COMMANDS:
        _add_lab_command(sub, name, load=command is None or command == name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `kvgate` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in LAB_COMMANDS:
        # Before parsing: without the extra the command's own flags are unknown, and its help cannot be built.
        _, missing = _load_lab_command(command)
        if missing:
            return _needs_extra(command, missing)(argparse.Namespace())
    args = build_parser(command if command in LAB_COMMANDS else "").parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
