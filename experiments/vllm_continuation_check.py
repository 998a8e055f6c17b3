"""Does a replica continue a cut answer as if uninterrupted? The continuation requests migration sends, checked.

For a greedy (temperature 0) request the whole answer is streamed once; its first K deltas (a token boundary,
where a cut stream stops) are then sent as the open assistant turn, the way app/migration/ continues a cut
stream: Responses as an `in_progress` assistant item on /v1/responses (vLLM's should_continue_final_message),
Messages as vLLM's chat request with `continue_final_message` on /v1/chat/completions; trailing whitespace is
held back and dropped from the continuation's start as the gateway does (--no-held-back: sent as it is).
Prints whether opening + continuation equals the whole answer, and else how many characters after the cut
still agree (a continuation
prefills the delivered tokens in one batch where the original decoded them one by one: vLLM is not bit-exact
between the two, so a greedy near-tie can flip later on; a splice fault would disagree at the cut itself).
Read-only: a few small requests to a running server (vLLM or a sim).

    .venv/bin/python experiments/vllm_continuation_check.py --url http://127.0.0.1:8001 --model smollm2-135m
"""

from __future__ import annotations

import argparse
import json

import httpx

from app.surfaces.migration import after_held


def streamed_deltas(c: httpx.Client, url: str, body: dict[str, object]) -> list[str]:
    """The output_text deltas of a streamed Responses request."""
    out: list[str] = []
    with c.stream("POST", url + "/v1/responses", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                d = json.loads(line[5:])
                if d["type"] == "response.output_text.delta":
                    out.append(d["delta"])
    return out


def agreement(opening: str, rest: str, whole: str) -> str:
    """'same' when the spliced text is the whole answer, else agreeing characters after the cut / the rest's."""
    spliced = opening + rest
    if spliced == whole:
        return "same"
    agree = next((i for i, (a, b) in enumerate(zip(spliced, whole, strict=False)) if a != b),
                 min(len(spliced), len(whole))) - len(opening)  # fmt: skip
    return f"{agree}/{len(whole) - len(opening)}"


def main() -> None:
    """Run the check for a few prompts and cut points; one line per case."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8001")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--tokens", type=int, default=40)
    p.add_argument("--no-held-back", dest="held_back", action="store_false",
                   help="send the opening whole, trailing whitespace included (the gateway holds it back)")
    args = p.parse_args()
    c = httpx.Client(timeout=120)
    prompts = ["Write two sentences about the sea.", "Explain what a circuit breaker does in software.",
               "List four fruits and their colors."]  # fmt: skip
    print(f"{'prompt':52s} {'cut':>4s} {'responses':>14s} {'messages':>14s}   (cut: tokens delivered of "
          f"{args.tokens}; 'same', or characters after the cut that agree / of the rest)")
    for q in prompts:
        base = {"model": args.model, "input": q, "temperature": 0, "max_output_tokens": args.tokens}
        deltas = streamed_deltas(c, args.url, base)
        whole = "".join(deltas)
        msg = c.post(args.url + "/v1/messages", json={"model": args.model, "max_tokens": args.tokens,
                                                      "temperature": 0, "messages": [{"role": "user", "content": q}]})
        msg_whole = "".join(b.get("text", "") for b in msg.json()["content"])
        for cut in (len(deltas) // 4, len(deltas) // 2, 3 * len(deltas) // 4):
            opening = "".join(deltas[:cut])
            # What the gateway does: the partial turn without trailing whitespace (Delivered.resume_text), its
            # tokens counted by the replica's own /tokenize (a delta may carry several, e.g. speculative).
            kept = opening.rstrip() or opening if args.held_back else opening
            held = opening[len(kept):]
            sent = c.post(args.url + "/tokenize", json={"model": args.model, "prompt": kept,
                                                        "add_special_tokens": False}).json()["count"]
            left = args.tokens - sent
            item = {"id": "msg_cut", "type": "message", "role": "assistant", "status": "in_progress",
                    "content": [{"type": "output_text", "text": kept, "annotations": []}]}
            resp = c.post(args.url + "/v1/responses", json={**base, "max_output_tokens": left,
                                                            "input": [{"role": "user", "content": q}, item]}).json()
            rest = after_held(held, "".join(part.get("text", "") for it in resp["output"]
                                            for part in it.get("content") or ()))  # fmt: skip
            chat = {"model": args.model, "max_tokens": left, "temperature": 0, "continue_final_message": True,
                    "add_generation_prompt": False,
                    "messages": [{"role": "user", "content": q}, {"role": "assistant", "content": kept}]}
            cont = after_held(held, c.post(args.url + "/v1/chat/completions", json=chat).json()["choices"][0]
                              ["message"]["content"])  # fmt: skip
            same_r, same_m = agreement(opening, rest, whole), agreement(opening, cont, msg_whole)
            print(f"{q[:52]:52s} {sent:4d} {same_r:>14s} {same_m:>14s}")


if __name__ == "__main__":
    main()
