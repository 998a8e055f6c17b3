"""Reply learning through the gateway: a kv_events pool in front of a sim that publishes KV events; once a
response (complete or streamed) was sent, the next turn's prefix is hashed and only its new message is unseen."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import openai
import pytest

from app.api.app import create_app
from app.gateway import Gateway
from app.sim.testing import free_port, running_sim
from tests.conftest import PUBLIC_MODEL, gateway_config
from tests.servers import serve_in_thread

SMOLLM2 = Path.home() / ".cache/kvgate/models/smollm2-135m"
pytestmark = pytest.mark.skipif(
    not (SMOLLM2 / "tokenizer.json").exists(), reason="SmolLM2 folder not converted (scripts/vllm-cpu.sh model)"
)
SYSTEM = "You are the build agent of this repository. " * 20


def learned_after(gateway: Gateway, n: int) -> None:
    """Learning runs once the response was sent: poll briefly for it."""
    deadline = time.monotonic() + 5
    while gateway.replies.learned < n:
        assert time.monotonic() < deadline, f"learned {gateway.replies.learned} replies, expected {n}"
        time.sleep(0.01)


@pytest.mark.parametrize("stream", [False, True])
def test_a_sent_reply_leaves_the_next_turn_only_its_new_message(tmp_path: Path, stream: bool) -> None:
    pub = f"ipc://{tmp_path}/kv.pub"
    sim = {"model": "served-model", "tokenizer": str(SMOLLM2), "block_size": 16, "kv_events": pub, "kv_topic": "kv"}
    with running_sim(**sim) as url:
        cfg = gateway_config(
            [], pools={"main": {
                "role": "interactive", "served_model": "served-model", "tokenizer": str(SMOLLM2),
                "replicas": [{"url": url, "kv_events": pub, "kv_replay": f"tcp://127.0.0.1:{free_port()}"}],
                "policy": {"type": "kv_events", "block_size": 16},
                "price": {"input_per_m": 1.0, "cached_input_per_m": 0.1, "output_per_m": 2.0},
            }},
        )  # fmt: skip
        app = create_app(cfg)
        with serve_in_thread(app) as gw:
            gateway: Gateway = app.api.state.gateway
            client = openai.OpenAI(base_url=f"{gw}/v1", api_key="EMPTY", max_retries=0, timeout=30)
            messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Build it."}]
            if stream:
                chunks = client.chat.completions.create(model=PUBLIC_MODEL, messages=messages, max_tokens=12,
                                                        stream=True)  # fmt: skip
                reply = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            else:
                done = client.chat.completions.create(model=PUBLIC_MODEL, messages=messages, max_tokens=12)
                reply = done.choices[0].message.content or ""
            assert reply
            learned_after(gateway, 1)
            hasher = gateway.replies.hashers.get(PUBLIC_MODEL)
            assert hasher is not None
            nxt = {"messages": [*messages, {"role": "assistant", "content": reply},
                                {"role": "user", "content": "Now test it."}]}  # fmt: skip
            assert hasher.unseen_pieces(hasher.render(nxt)) == ["user\nNow test it."]
