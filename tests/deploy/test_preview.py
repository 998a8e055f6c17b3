"""grafana/preview.py's pure parts: Grafana's variable substitution, legend templating and unit formatting."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.deploy.files import ROOT


def _preview() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kvgate_preview", ROOT / "grafana" / "preview.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


PREVIEW = _preview()


def test_substitute_fills_every_variable_the_dashboards_use() -> None:
    out = PREVIEW.substitute(
        'sum(increase(x{tenant=~"$tenant", pool=~"$pool"}[$__range])) / rate(y[$__rate_interval])', 600
    )
    assert out == 'sum(increase(x{tenant=~".*", pool=~".*"}[600s])) / rate(y[1m])'


def test_legend_templates_labels_like_grafana() -> None:
    labels = {"__name__": "m", "tenant": "acme", "pool": "fast"}
    assert PREVIEW.legend("p99 {{ tenant }} → {{pool}}", labels) == "p99 acme → fast"
    assert PREVIEW.legend("__auto", labels) == "tenant=acme, pool=fast"
    assert PREVIEW.legend("{{missing}}", labels) == ""


def test_values_are_formatted_in_the_panel_unit() -> None:
    assert PREVIEW.fmt_value(0.25, "percentunit") == "25.0%"
    assert PREVIEW.fmt_value(0.0123, "s") == "12.3 ms"
    assert PREVIEW.fmt_value(12.5, "currencyUSD") == "$12.50"
    assert PREVIEW.fmt_value(float("nan"), "short") == "n/a"
