"""`kvgate check-config --probe`: what each replica published, what the config overrides, what disagrees."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.cli import main
from app.config import parse_config
from app.engine_report import probe
from app.sim.testing import running_sim
from tests.routing.factory import PRICE


def test_probe_reports_published_facts_overrides_and_disagreements() -> None:
    with running_sim(model="s", speculative="ngram:3:0.6") as fast, \
            running_sim(model="s", max_num_seqs=32, publish_max_num_seqs=True) as bulk:
        cfg = parse_config({
            "models": [{"name": "m", "pools": ["fast", "bulk"]}],
            "pools": {"fast": {"role": "interactive", "served_model": "s", "replicas": [fast], "price": PRICE},
                      "bulk": {"role": "bulk", "served_model": "s", "replicas": [bulk], "price": PRICE,
                               "max_num_seqs": 8}},
        })
        lines = asyncio.run(probe(cfg))
    fast_line = next(ln for ln in lines if ln.startswith(f"engine fast {fast}:"))
    assert "speculative=True, spec_tokens=3" in fast_line and "refuses min_p, logit_bias" in fast_line
    assert "config overrides nothing" in fast_line
    bulk_line = next(ln for ln in lines if ln.startswith(f"engine bulk {bulk}:"))
    assert "max_num_seqs=32" in bulk_line and "config overrides max_num_seqs=8" in bulk_line
    assert "in force: 8 slots, refuses nothing" in bulk_line
    assert f"disagrees: pool bulk replica {bulk}: config max_num_seqs=8, engine publishes 32 (config in force)" in lines


def test_probe_of_an_unreachable_replica_says_nothing_was_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "models: [{name: m, pools: [p]}]\n"
        "pools: {p: {role: bulk, served_model: s, replicas: ['http://127.0.0.1:9'],"
        " price: {input_per_m: 1, output_per_m: 1}}}\n"
    )
    assert main(["check-config", "--probe", str(path)]) == 0
    out = capsys.readouterr().out
    assert "engine p http://127.0.0.1:9: read nothing (not reachable yet)" in out


def test_a_running_gateway_reports_its_replicas_and_kv_hashing_after_ready() -> None:
    from app.engine_report import startup_lines
    from app.gateway import Gateway

    cfg = parse_config({
        "models": [{"name": "m", "pools": ["p"]}],
        "pools": {"p": {"role": "bulk", "served_model": "s", "replicas": ["http://127.0.0.1:9"], "price": PRICE,
                        "max_num_seqs": 4, "tokenizer": str(Path(__file__).parent / "fixtures"),
                        "policy": "kv_events"}},
    })
    lines = startup_lines(Gateway(cfg))
    assert lines[0].startswith("engine p http://127.0.0.1:9: read nothing (not reachable yet); "
                               "config overrides max_num_seqs=4")
    assert "kv_events m: not hashed (nothing published, or disagreeing)" in lines


def test_startup_lines_of_something_not_a_gateway_are_empty() -> None:
    from app.engine_report import startup_lines

    assert startup_lines(object()) == []
