"""The CLI's own behaviour: the ready line `kvgate serve` prints, and lab commands without their extra."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from app import cli
from app.config import load_config


def _replica(probed: bool, healthy: bool) -> SimpleNamespace:
    return SimpleNamespace(probed=probed, available=lambda: healthy)


def test_ready_line_counts_healthy_replicas_per_pool_after_the_first_probe() -> None:
    cfg = load_config()
    line = cli.ready_line(
        "http://127.0.0.1:8080", cfg, [("fast", _replica(True, True)), ("bulk", _replica(True, False))]
    )
    assert (
        line == "kvgate ready on http://127.0.0.1:8080 - pools fast (1/1 replica healthy), bulk (0/1 replica healthy)"
    )


def test_ready_line_says_which_replicas_were_not_probed_yet() -> None:
    cfg = load_config()
    line = cli.ready_line("http://h:1", cfg, [("fast", _replica(False, True)), ("bulk", _replica(True, True))])
    assert "fast (0/1 replica healthy, 1 not probed yet)" in line and "bulk (1/1 replica healthy)" in line


def test_ready_line_falls_back_to_configured_counts_without_gateway_state() -> None:
    cfg = load_config()
    assert (
        cli.ready_line("http://h:1", cfg, []) == "kvgate ready on http://h:1 - pools fast (1 replica), bulk (1 replica)"
    )


def test_missing_extra_reads_kvgate_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    requires = ['rich>=13; extra == "bench"', 'no-such-dist-kvgate>=1; extra == "bench"', "orjson>=3"]
    monkeypatch.setattr(cli.importlib.metadata, "requires", lambda name: requires)
    assert cli.missing_extra("bench") == ["no-such-dist-kvgate"]
    assert cli.missing_extra("sim") == []


def test_lab_command_without_its_extra_exits_2_before_parsing_its_flags(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "missing_extra", lambda extra: ["tokenizers"] if extra == "sim" else [])
    assert cli.main(["sim", "--port", "1", "--no-such-flag"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'kvgate[sim]'" in err and "tokenizers" in err
