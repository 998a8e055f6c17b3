"""`kvgate bench` end to end in a subprocess against the loopback fake server."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import orjson
import pytest
import yaml

from kvlab.fake_openai import FakeOpenAI, serving

ROOT = Path(__file__).resolve().parents[2]

# Real subprocesses (interpreter start-up, matplotlib): a few seconds each.
pytestmark = pytest.mark.slow


async def _kvgate_bench(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "app.cli", "bench", *args, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_sweep_prints_table_writes_json_and_png(tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text(yaml.safe_dump({"price": {"gpu_hour_usd": 2.5, "gpus": 1},
                                      "reference_price": {"input_per_m": 3, "cached_input_per_m": 0.3,
                                                          "output_per_m": 15}}))
    fake = FakeOpenAI(tokens=3, first_delay_s=0.005, token_delay_s=0.001)
    async with serving(fake) as url:
        code, out, err = await _kvgate_bench(
            "--base-url", url, "--workload", "agent", "--concurrency", "1,4", "--requests", "8",
            "--slo-ttft-ms", "1000", "--slo-tpot-ms", "100", "--price-config", str(prices),
            "--json", str(tmp_path / "out.json"), "--plot", str(tmp_path / "sweep.png"), "--quiet",
        )
    assert code == 0, err
    assert "TTFT ms p50/p90/p99" in out and "agent c=1" in out and "agent c=4" in out
    doc = orjson.loads((tmp_path / "out.json").read_bytes())
    assert [run["spec"]["concurrency"] for run in doc["sweep"]] == [1, 4]
    assert all(run["summary"]["ok"] == 8 and len(run["records"]) == 8 for run in doc["sweep"])
    assert all(run["summary"]["cost"]["usd_per_m_output"] > 0 for run in doc["sweep"])
    assert all(run["summary"]["goodput_requests_per_s"] is not None for run in doc["sweep"])
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_errors_give_exit_code_1_and_bad_price_config_exit_code_2(tmp_path: Path) -> None:
    fake = FakeOpenAI(tokens=2, first_delay_s=0.0, token_delay_s=0.0)
    async with serving(fake) as url:
        code, out, _ = await _kvgate_bench("--base-url", url, "--api-key", "sk-bad", "--model", "m",
                                           "--requests", "2", "--concurrency", "1", "--quiet")
        assert code == 1 and "HTTP 401" in out
        bad = tmp_path / "bad.yaml"
        bad.write_text("price: {gpu_hour_usd: -3}\n")
        code, _, err = await _kvgate_bench("--base-url", url, "--price-config", str(bad), "--quiet")
        assert code == 2 and "gpu_hour_usd" in err


async def test_mixed_workload_sends_class_headers_and_max_tokens(tmp_path: Path) -> None:
    fake = FakeOpenAI(tokens=2, first_delay_s=0.0, token_delay_s=0.0)
    async with serving(fake) as url:
        code, _, err = await _kvgate_bench("--base-url", url, "--workload", "mixed", "--mixed-ratio", "0.5",
                                           "--requests", "10", "--concurrency", "2", "--max-tokens", "7",
                                           "--quiet")
    assert code == 0, err
    classes = {r["headers"].get("x-kvgate-class") for r in fake.received}
    assert classes <= {"interactive", "bulk"} and classes
    assert all(r["body"]["max_tokens"] == 7 for r in fake.received)
