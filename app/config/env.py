"""`KVGATE_<KEY>__<SUBKEY>` environment variables as a pydantic-settings source, lists and objects as YAML.

pydantic-settings' EnvSettingsSource reads the process environment and nests `__`-separated names; it decodes
the value of a list or object key (`KVGATE_MODELS`, `KVGATE_TENANTS`, `KVGATE_POOLS__FAST__REPLICAS`) as JSON
only. This source decodes it as YAML, a superset of JSON: both `[{"name": "m", "pools": ["fast"]}]` and the
shorter flow form `[{name: m, pools: [fast]}]` work (compose files and Kubernetes manifests write either).
A value that is neither is a ConfigError naming the variable, not a bare "error parsing value".
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic.fields import FieldInfo
from pydantic_settings import EnvSettingsSource


class EnvValueError(ValueError):
    """A list or object variable whose value is not YAML (nor JSON)."""

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(f"{variable}: {message}")
        self.variable = variable
        self.message = message


class YamlEnvSource(EnvSettingsSource):
    """EnvSettingsSource whose list and object values are YAML flow collections (or JSON)."""

    def decode_complex_value(self, field_name: str, field: FieldInfo | None, value: Any) -> Any:
        """The value of a list or object key, parsed as YAML."""
        if not isinstance(value, str):
            return value
        try:
            return yaml.safe_load(value)
        except yaml.YAMLError as err:
            raise EnvValueError(self._variable(field_name, value), f"not JSON or YAML: {_first_line(err)}") from None

    def _variable(self, field_name: str, value: str) -> str:
        # pydantic-settings hands over the key, not the variable: find the variable holding this value.
        names = sorted(k.upper() for k, v in self.env_vars.items() if v == value and k.endswith(field_name.lower()))
        return " / ".join(names) or f"KVGATE_…{field_name.upper()}"


def _first_line(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return f"{problem} (column {mark.column + 1})" if mark is not None else str(problem)
