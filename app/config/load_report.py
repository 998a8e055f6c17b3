"""`pools.<p>.load_report`: ask the replicas for vLLM's in-band load report (app/routing/load_report.py).

Part of the schema (PoolConfig mounts it with one line).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from app.config.types import StrictModel

# How vLLM encodes its in-band load header (endpoint-load-metrics-format).
LoadReportFormat = Literal["TEXT", "JSON"]


class LoadReportSettings(StrictModel):
    """On by default: every kvgate pool is vLLM, which answers chat and completions requests that ask."""

    enabled: bool = Field(True, description=(
        "Ask each chat and completions response for vLLM's load report (`endpoint-load-metrics-format`)."))
    format: LoadReportFormat = Field("TEXT", description=(
        "The report's format; both parse the same, TEXT is the shorter header and vLLM's own example."))
