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

from dataclasses import dataclass

from app.context import RequestContext
from app.limits import max_output_tokens, tpm_tokens


@dataclass(frozen=True, slots=True)
class CallEstimate:
    """A request's predicted tokens on its picked replica."""

    prompt_tokens: int
    cached_tokens: int  # ≤ prompt_tokens: the picked replica's predicted prefix reuse
    output_tokens: int  # the output cap (0: none set)
    exact: bool  # prompt_tokens is the tokenizer's count, not the character estimate

    def tpm_tokens(self, cached_weight: float) -> int:
        """What the request is predicted to charge the TPM window (prompt, cached at their weight, output)."""
        return tpm_tokens(self.prompt_tokens, self.cached_tokens, self.output_tokens, cached_weight)



def estimate_call(ctx: RequestContext) -> CallEstimate:
    """The estimate once ctx.route is picked: the exact prompt when the blocks were hashed, the pick's cache hit."""
    blocks = ctx.blocks
    exact = blocks is not None
    prompt = blocks.n_tokens if blocks is not None else ctx.estimated_input_tokens
    route = ctx.route
    cached = route.cached_tokens if route is not None and route.cached_tokens is not None else 0
    out = max_output_tokens(ctx.body, ctx.surface.output_cap_fields)
    return CallEstimate(prompt, min(cached, prompt), out, exact)
