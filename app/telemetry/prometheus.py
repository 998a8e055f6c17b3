"""Render the Prometheus text exposition of the gateway's own registry (served on /metrics)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def render(registry: CollectorRegistry) -> tuple[bytes, str]:
    """Body and content type; collecting runs the metric callbacks, so call it per scrape, not per request."""
    return generate_latest(registry), CONTENT_TYPE_LATEST
