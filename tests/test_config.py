"""Config loading: key-path problems, YAML's on/off, environment overrides, the shipped files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from app.config import EMBEDDED_CONFIG, ConfigError, load_config, parse_config
from tests.config_env import parse_with_env

ROOT = Path(__file__).resolve().parent.parent


def minimal(**extra: object) -> dict[str, object]:
    raw: dict[str, object] = {
        "models": [{"name": "m", "pools": ["p"]}],
        "pools": {"p": {"role": "bulk", "served_model": "m", "replicas": ["http://a:1"],
                        "price": {"input_per_m": 1, "output_per_m": 2}}},
    }
    raw.update(extra)
    return raw


def test_shipped_configs_are_valid() -> None:
    for name in ("local.yaml", "gateway.yaml"):
        cfg = load_config(ROOT / "config" / name)
        assert cfg.model("smollm2-135m") is not None


def test_embedded_default_is_local_yaml() -> None:
    assert load_config().pools["fast"].replicas == [f"http://127.0.0.1:{8001}"]
    assert EMBEDDED_CONFIG.name == "local.yaml"


def test_yaml_on_off_become_normalize_modes() -> None:
    cfg = parse_config(minimal(tenants=[{"id": "a", "normalize": True}, {"id": "b", "normalize": False}]))
    assert [t.normalize for t in cfg.tenants] == ["on", "off"]


def test_problems_carry_key_paths() -> None:
    raw = minimal()
    raw["pools"]["p"]["replicas"] = ["http://ok:1", "not a url"]  # type: ignore[index]
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert "pools.p.replicas[1]: not a URL" in str(info.value)


def test_cross_references_are_checked() -> None:
    raw = minimal(models=[{"name": "m", "pools": ["p", "ghost"]}],
                  tenants=[{"id": "t", "api_keys": ["k"]}, {"id": "t", "api_keys": ["k"]}])
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    text = str(info.value)
    assert "models[0].pools[1]: unknown pool 'ghost'" in text
    assert "tenants[1].id: duplicate tenant 't'" in text
    assert "tenants[1].api_keys[0]: key already used by another tenant" in text


def test_unknown_normalize_rule_is_a_problem() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(minimal(tenants=[{"id": "t", "normalize_rules": ["uuid", "nope"]}]))
    assert "tenants[0].normalize_rules[1]: unknown rule 'nope'" in str(info.value)


def test_environment_overrides_nested_keys() -> None:
    cfg = parse_with_env(minimal(), {"KVGATE_LISTEN__PORT": "9123", "KVGATE_STORE__URL": "redis://h:6379/1"})
    assert cfg.listen.port == 9123
    assert cfg.store.url == "redis://h:6379/1"
    assert cfg.pools["p"].served_model == "m"  # the file's keys beside an overridden one stay


def test_environment_null_and_empty_values() -> None:
    raw = minimal(store={"url": "redis://h:6379/0"})
    assert parse_with_env(raw, {"KVGATE_STORE__URL": "null"}).store.url is None
    assert parse_with_env(raw, {"KVGATE_STORE__URL": ""}).store.url == "redis://h:6379/0"  # empty: unset


def test_environment_lists_and_objects_read_as_json_or_yaml() -> None:
    for models in ('[{"name": "x", "pools": ["p"]}]', "[{name: x, pools: [p]}]"):
        assert [m.name for m in parse_with_env(minimal(), {"KVGATE_MODELS": models}).models] == ["x"]
    cfg = parse_with_env(minimal(), {"KVGATE_POOLS__P__REPLICAS": "[http://b:2, http://c:3]"})
    assert cfg.pools["p"].replicas == ["http://b:2", "http://c:3"]


def test_environment_value_that_is_neither_names_its_variable() -> None:
    with pytest.raises(ConfigError) as info:
        parse_with_env(minimal(), {"KVGATE_MODELS": "[{name: x, pools: [p]"})
    assert str(info.value).startswith("KVGATE_MODELS: not JSON or YAML: ")


def test_routing_load_bound_points_to_the_policy() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(minimal(routing={"load_bound": 1.5}))
    assert "pools.<p>.policy.load_bound" in str(info.value)


@pytest.mark.slow
def test_compose_and_kubernetes_values_load_in_a_real_process_environment(tmp_path: Path) -> None:
    # What #23 hit: the container's variables are read by pydantic-settings from the process environment.
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(yaml.safe_dump(minimal()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    for models, tenants in (("[{name: x, pools: [p]}]", "[{id: t, api_keys: [k]}]"),
                            ('[{"name": "x", "pools": ["p"]}]', '[{"id": "t", "api_keys": ["k"]}]')):
        proc = subprocess.run([sys.executable, "-m", "app.cli", "check-config", str(cfg)], capture_output=True,
                              text=True, env={**env, "KVGATE_MODELS": models, "KVGATE_TENANTS": tenants}, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "ok: 1 model(s), pools: p (bulk, 1 replica(s)), 1 tenant(s)"
    bad = {**env, "KVGATE_TENANTS": "[{id: t"}
    proc = subprocess.run([sys.executable, "-m", "app.cli", "check-config", str(cfg)], capture_output=True,
                          text=True, env=bad, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("KVGATE_TENANTS: not JSON or YAML")


def test_check_config_exits_2_with_every_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: []\npools: {p: {role: nope}}\n")
    proc = subprocess.run([sys.executable, "-m", "app.cli", "check-config", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "models: List should have at least 1 item" in proc.stderr
    assert "pools.p.role" in proc.stderr


def test_serve_refuses_a_bad_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("listen: {port: 99999}\n")
    proc = subprocess.run([sys.executable, "-m", "app.cli", "serve", "--config", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "listen.port" in proc.stderr
