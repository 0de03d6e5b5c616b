"""The OpenAI Agents SDK integration where the SDK wraps what ninelives does:
an agent reached through ``handoff(agent)`` (a ``Handoff`` object, not the
agent) is durable too, and a cancel that lands during a tool call, which the
SDK reports as its own ``UserError``, still ends the run as cancelled. In one
process, through the library, on a real SQLite file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Model, ModelResponse, Runner, Usage, function_tool, handoff
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import ninelives
from ninelives.errors import TaskCancelled
from ninelives.integrations.openai_agents import durable

CALLS: list[str] = []
USAGE = Usage(requests=1, input_tokens=3, output_tokens=2, total_tokens=5)


def _call(name: str, arguments: dict[str, Any]) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call", call_id=f"call_{name}", name=name,
        arguments=json.dumps(arguments), id=f"fc_{name}", status="completed",
    )  # fmt: skip


def _answer(text: str) -> ModelResponse:
    message = ResponseOutputMessage(
        type="message", id="m", role="assistant", status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )  # fmt: skip
    return ModelResponse(output=[message], usage=USAGE, response_id=None)


class Scripted(Model):
    """A model that calls ``first`` (a tool or a handoff) until a tool answered."""

    def __init__(self, name: str, first: str | None, arguments: Any = None) -> None:
        self.name, self.first, self.arguments = name, first, arguments or {}

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        CALLS.append(f"model {self.name}")
        items = input if isinstance(input, list) else []
        answered = any(
            isinstance(i, dict) and i.get("type") == "function_call_output" for i in items
        )
        if self.first is None or answered:
            return _answer(f"{self.name} answered")
        return ModelResponse(
            output=[_call(self.first, self.arguments)], usage=USAGE, response_id=None
        )

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def triage(to_billing: Any) -> Agent[Any]:
    billing = Agent(name="billing", model=Scripted("billing", None))
    target = handoff(billing) if to_billing == "handoff" else billing
    return Agent(name="triage", model=Scripted("triage", "transfer_to_billing"), handoffs=[target])


@ninelives.workflow("handoffs_triage")
def triage_flow(ctx: Any, how: str) -> str:
    return str(Runner.run_sync(durable(triage(how)), "refund please").final_output)


@function_tool
def slow_post(text: str) -> str:
    """Post a note; the task is cancelled meanwhile."""
    CALLS.append("slow_post")
    with ninelives.open(DB[0]) as other:
        other.cancel("c")
    return "posted " + text


@ninelives.workflow("handoffs_cancelled")
def cancelled_flow(ctx: Any) -> str:
    model = Scripted("notes", "slow_post", {"text": "hi"})
    agent = Agent(name="notes", model=model, tools=[slow_post])
    return str(Runner.run_sync(durable(agent), "post it").final_output)


DB: list[str] = []


@pytest.fixture
def rt(tmp_path: Path) -> Any:
    CALLS.clear()
    DB[:] = [str(tmp_path / "state.db")]
    from agents import set_tracing_disabled

    set_tracing_disabled(True)
    with ninelives.open(DB[0]) as runtime:
        yield runtime


@pytest.mark.parametrize("how", ["agent", "handoff"])
def test_the_agent_a_handoff_reaches_is_durable(rt: Any, how: str) -> None:
    rt.create("t", triage_flow, how)
    rt.run("t")
    assert rt.result("t") == "billing answered"
    # billing's model call is a step: a replay after a kill reads it, never pays again
    assert [s.tool for s in rt.status("t").steps] == ["model:triage", "model:billing"]
    assert CALLS == ["model triage", "model billing"]


def test_a_cancel_during_a_tool_the_sdk_wraps_ends_the_run_as_cancelled(rt: Any) -> None:
    rt.create("c", cancelled_flow)
    with pytest.raises(TaskCancelled):
        rt.run("c")
    assert CALLS == ["model notes", "slow_post"]
    assert rt.status("c").status.value == "cancelled"
