"""Evaluate the Grafana dashboards' queries against a running Prometheus, with the values Grafana would fill in.

Shared by tests/deploy/test_dashboard_queries.py (sims on loopback) and tests/deploy/test_compose_stack.py (the
compose stack), so both judge "this panel has data" the same way.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import httpx

from tests.deploy.files import DASHBOARDS, dashboard_targets

# Values Grafana would put in; every range must hold several scrapes of the traffic.
SUBSTITUTIONS = {"$__rate_interval": "1m", "$__range": "10m", "$__interval": "15s", "$tenant": ".*", "$pool": ".*"}


def substitute(expr: str) -> str:
    """A dashboard query with its Grafana variables filled in (SUBSTITUTIONS)."""
    for var, value in SUBSTITUTIONS.items():
        expr = expr.replace(var, value)
    return expr


def prometheus_query(prometheus: str, expr: str) -> dict[str, Any]:
    """Prometheus' JSON answer to an instant query."""
    body: dict[str, Any] = httpx.post(f"{prometheus}/api/v1/query", data={"query": expr}, timeout=10).json()
    return body


def dashboard_outcomes(prometheus: str, paths: list[Path] = DASHBOARDS) -> list[tuple[str, str, str, str]]:
    """(dashboard file, panel title, query, outcome) for every query of the dashboards, evaluated now; the outcome
    is "data", "no data", "only NaN/Inf" or Prometheus' error."""
    out = []
    for path in paths:
        for title, expr in dashboard_targets(path):
            body = prometheus_query(prometheus, substitute(expr))
            result = body.get("data", {}).get("result") if body.get("status") == "success" else None
            if result is None:
                outcome = f"error: {body.get('error')}"
            elif not result:
                outcome = "no data"
            elif not any(math.isfinite(float(s["value"][1])) for s in result):
                outcome = "only NaN/Inf"
            else:
                outcome = "data"
            out.append((path.name, title, expr, outcome))
    return out
