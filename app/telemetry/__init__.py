"""Settle-stage telemetry: spans, metrics, Prometheus text and OTLP export (see recorder.Telemetry)."""

from app.telemetry.recorder import Telemetry

__all__ = ["Telemetry"]
