"""Every KVGATE_* value a compose file, .env.example or a Kubernetes manifest hands the gateway reaches it through a
real process environment, as in its container: the gateway's config is loaded in a child process whose environment
holds exactly those values, and must be the config the other deploy tests build from the same values as a mapping.
(pydantic-settings' own env source reads complex values as JSON only: YAML flow text such as
`[{name: m, pools: [fast]}]` passed a mapping-based test and failed every real container.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.config_env import parse_with_env
from tests.deploy.files import ENV_EXAMPLE, ROOT, STACK_FILES, effective_compose, flag, read_env_file

# Real processes and seconds-long waits: the slow tier (scripts/test.sh runs it after the fast one).
pytestmark = pytest.mark.slow

STACKS = STACK_FILES
_LOAD = "import sys; from app.config import load_config; print(load_config(sys.argv[1]).model_dump_json())"


def load_in_a_process(config: str, env: Mapping[str, str], tmp: Path) -> dict[str, Any]:
    """The gateway's config as a fresh process loads it: `config` as its file, `env` as its whole KVGATE_* set."""
    path = tmp / "gateway.yaml"
    path.write_text(config)
    base = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    out = subprocess.run([sys.executable, "-c", _LOAD, str(path)], env={**base, **env}, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"the gateway refuses its environment:\n{out.stdout}{out.stderr}"
    loaded: dict[str, Any] = json.loads(out.stdout)
    return loaded


def env_example_kvgate() -> dict[str, str]:
    """.env.example's own KVGATE_* lines (compose reads them; a gateway handed the whole file must take them)."""
    return {k: v for k, v in read_env_file(ENV_EXAMPLE).items() if k.startswith("KVGATE_")}


@pytest.mark.parametrize("files", STACKS.values(), ids=STACKS.keys())
def test_compose_gateway_environment_loads_in_a_real_process(files: tuple[Path, ...], tmp_path: Path) -> None:
    gw = effective_compose(*files)["services"]["gateway"]
    env = {**env_example_kvgate(), **{k: str(v) for k, v in gw["environment"].items()}}
    assert env["KVGATE_MODELS"], "the model name reaches the gateway through its environment"
    target = flag(gw["command"], "--config")
    source = next(ROOT / v.split(":")[0] for v in gw["volumes"] if v.split(":")[1] == target)
    text = source.read_text()
    got = load_in_a_process(text, env, tmp_path)
    assert got == parse_with_env(yaml.safe_load(text), env).model_dump(mode="json")
    served = read_env_file(ENV_EXAMPLE)["SERVED_MODEL_NAME"]
    assert [m["name"] for m in got["models"]] == [served]
    assert {p["served_model"] for p in got["pools"].values()} == {served}
    assert got["normalize"]["salt_secret"] == env["KVGATE_NORMALIZE__SALT_SECRET"]
    assert got["pools"]["fast"]["speculative"], "the fast engine always speculates"


def test_kubernetes_gateway_environment_loads_in_a_real_process(tmp_path: Path) -> None:
    k8s = pytest.importorskip("tests.deploy.test_kubernetes")
    if k8s.kubectl() is None:
        pytest.skip("no kubectl to render the overlays")
    for overlay in k8s.OVERLAYS:
        objs = k8s.objects(overlay)
        gw = k8s.named(objs, "Deployment", "gateway")
        [c] = k8s.pod_spec(gw)["containers"]
        env = {k: v for k, v in k8s.environment(objs, c).items() if k.startswith("KVGATE_")}
        assert {"KVGATE_MODELS", "KVGATE_TENANTS"} <= set(env), overlay
        text = k8s.mounted_file(objs, gw, flag(c["args"], "--config") or "")
        got = load_in_a_process(text, env, tmp_path)
        assert got == parse_with_env(yaml.safe_load(text), env).model_dump(mode="json"), overlay
        assert got["tenants"] and all(k.startswith("sha256:") for t in got["tenants"] for k in t["api_keys"]), overlay
        assert got["pools"]["fast"]["speculative"], overlay
