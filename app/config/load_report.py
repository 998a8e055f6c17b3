"""`pools.<p>.load_report`: ask the replicas for vLLM's in-band load report (app/routing/load_report.py).

Self-contained (no import of app.config) so PoolConfig mounts it with one line.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

# How vLLM encodes its in-band load header (endpoint-load-metrics-format).
LoadReportFormat = Literal["TEXT", "JSON"]


class LoadReportSettings(BaseModel):
    """On by default: every kvgate pool is vLLM, which answers chat and completions requests that ask."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    # Both parse the same; TEXT is the shorter header and vLLM's own example.
    format: LoadReportFormat = "TEXT"
