"""`routing.tpot`: interactive pool choice by predicted TPOT (app/routing/tpot). Self-contained, as its siblings."""

from __future__ import annotations

from pydantic import Field

from app.config.types import StrictModel


class TpotSettings(StrictModel):
    """When and how an interactive request may leave its class's pool for a faster one of its model."""

    enabled: bool = Field(
        True,
        description="Choose an interactive request's pool by predicted TTFT + output tokens x TPOT. It engages "
        "only for a model with both an interactive and a bulk pool once the engines' /metrics gave both pools "
        "enough decode samples; until then (and when off) routing is by class alone.",
    )
    hysteresis: float = Field(
        0.15, ge=0.0, lt=1.0,
        description="A request (or a session) leaves the pool it would use for another only when the other's "
        "predicted time is lower by this fraction: predictions that are close do not move traffic back and forth.",
    )
    min_samples: int = Field(
        3, ge=1, description="Scrape intervals with decode steps a pool needs before its step-time fit is used."
    )
    window: int = Field(
        96, ge=8, le=1024,
        description="(decode batch, step time) points kept per pool for the fit; older ones are dropped.",
    )
    stale_s: float = Field(
        30.0, gt=0.0,
        description="A class's pool that the router has sent no decoding request for this long gets one request "
        "per this interval anyway (outcome `probe`): its step times are then measured again, not remembered.",
    )
    sessions: int = Field(
        8192, ge=0,
        description="Sessions (routing-key hashes, no content) whose last pool is remembered for affinity: a "
        "session moves only when the gain beats the prefill of its cached prefix on the pool it leaves.",
    )
    prior_streams: float = Field(
        8.0,
        gt=0.0,
        description="Streams of a (tenant, kind) before its own acceptance counts as much as its pool's average.",
    )
    default_output_tokens: int = Field(
        256, ge=1, description="Output length assumed for a (tenant, kind) not seen yet, capped by max_tokens."
    )
