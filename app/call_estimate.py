"""Cost before the call: what a request is predicted to use once its replica is picked.

The limits stage admits before any replica is known: a character estimate of the prompt (app/limits.py), every
prompt token counted in full. After pick a kv_events pool knows two things more: the prompt's exact token count
(the tokenizer ran to hash its blocks) and the tokens the chosen replica is predicted to reuse (the pick's
`cached=` in x-kvgate-route). `CallEstimate` carries both, typed, from pick to the limits stage, which corrects
the tenant's TPM reservation before the upstream call, and to the bill of a stream cut before its usage came
(app/relay.py).

A cached token is cheaper: it costs the pool's cached-input price, and in the TPM window it counts
`limits.tpm_cached_weight` of a token (1, the default, is OpenAI's rule: every prompt token counts; 0 is
Anthropic's cache-aware input limit, where cache reads do not count). Settle corrects the reservation to the
actual usage by the same rule, so the reservation only decides how much of the window a request holds while it
runs.
"""

from __future__ import annotations

from app.context import RequestContext
from app.hooks import PathHook
from app.limits import Limiter, max_output_tokens
from app.records import CallEstimate


def estimate_call(ctx: RequestContext) -> CallEstimate:
    """The estimate once ctx.route is picked: the exact prompt when the blocks were hashed, the pick's cache hit."""
    blocks = ctx.blocks
    exact = blocks is not None
    prompt = blocks.n_tokens if blocks is not None else ctx.estimated_input_tokens
    route = ctx.route
    cached = route.cached_tokens if route is not None and route.cached_tokens is not None else 0
    out = max_output_tokens(ctx.body, ctx.surface.output_cap_fields)
    return CallEstimate(prompt, min(cached, prompt), out, exact)


class CallPricing(PathHook):
    """After pick, before each upstream call: the request's estimate on its replica; the TPM reservation follows."""

    name = "call_pricing"

    def __init__(self, limiter: Limiter) -> None:
        self.limiter = limiter

    def after_pick(self, ctx: RequestContext) -> None:
        """Estimate the call on the picked replica and move the tenant's TPM reservation to it."""
        ctx.call_estimate = estimate = estimate_call(ctx)
        if ctx.admission is not None:
            self.limiter.reserve_estimate(ctx.admission, estimate)
