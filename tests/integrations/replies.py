"""A scripted reply through each adapter, run, replayed and verified (shared by
``test_framework_replies.py``'s fixed cases and fuzz targets).

The first model request of the run gets :data:`REPLY`, given as parts:
``("text", str)`` or ``("call", tool name, arguments)`` (arguments a JSON-able
value, or the raw JSON text a model sends). Every later request gets a final
answer that quotes what the model read back (tool results, retry prompts,
errors), so a replay that read back anything else would answer differently.
The workflow keeps the first run's answer as a step, then waits on an approval;
once approved, the run replays the agent from the journal and returns both.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
from pathlib import Path
from typing import Any

from agents import Agent as OAIAgent
from agents import Model, RunConfig, Runner, Usage, function_tool
from agents import ModelResponse as OAIResponse
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import ninelives
from ninelives.errors import NineLivesError, TaskWaiting
from ninelives.integrations.openai_agents import durable
from ninelives.integrations.pydantic_ai import NinelivesDurability
from ninelives.parking import approve
from ninelives.verify import verify_store

REPLY: list[tuple[Any, ...]] = []
#: What ran in this process: ``model`` and ``echo <size>`` lines.
RAN: list[str] = []


def _read_back(seen: list[str]) -> str:
    return "final " + json.dumps([s[:200] for s in seen], ensure_ascii=True)


def pai_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    RAN.append("model")
    if any(m.kind == "response" for m in messages):
        seen = [
            str(p.content)
            for m in messages
            for p in m.parts
            if p.part_kind in ("tool-return", "retry-prompt")
        ]
        return ModelResponse(parts=[TextPart(_read_back(seen))])
    parts: list[Any] = []
    for n, part in enumerate(REPLY):
        if part[0] == "text":
            parts.append(TextPart(part[1]))
        else:
            parts.append(ToolCallPart(part[1], part[2], tool_call_id=f"call_{n}"))
    return ModelResponse(parts=parts)


def echo(value: Any = None) -> str:
    """Say how big the value was (its repr's length)."""
    RAN.append(f"echo {len(repr(value))}")
    return f"echo got {len(repr(value))} characters"


PAI = Agent(FunctionModel(pai_model), name="replies", capabilities=[NinelivesDurability()])
PAI.tool_plain(echo)


class ScriptedOAI(Model):
    """The same script in the OpenAI Agents SDK's types."""

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> Any:
        RAN.append("model")
        items = input if isinstance(input, list) else []
        seen = [
            str(i["output"])
            for i in items
            if isinstance(i, dict) and i.get("type") == "function_call_output"
        ]
        usage = Usage(requests=1, input_tokens=3, output_tokens=2, total_tokens=5)
        replied = any(isinstance(i, dict) and i.get("type") == "function_call" for i in items)
        parts = [("text", _read_back(seen))] if replied else REPLY
        output: list[Any] = []
        for n, part in enumerate(parts):
            if part[0] == "text":
                output.append(_message(part[1]))
            else:
                arguments = part[2] if isinstance(part[2], str) else json.dumps(part[2])
                output.append(
                    ResponseFunctionToolCall(
                        type="function_call",
                        call_id=f"call_{n}",
                        name=part[1],
                        arguments=arguments,
                        id=f"fc_{n}",
                        status="completed",
                    )
                )
        return OAIResponse(output=output, usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def _message(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        type="message", id="msg_1", role="assistant", status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )  # fmt: skip


OAI = durable(OAIAgent(name="replies", model=ScriptedOAI(), tools=[function_tool(echo)]))


@ninelives.workflow("replies_pai")
async def replies_pai(ctx: Any, question: str) -> dict[str, Any]:
    answer = str((await PAI.run(question)).output)
    return await _twice(ctx, answer)


@ninelives.workflow("replies_oai")
async def replies_oai(ctx: Any, question: str) -> dict[str, Any]:
    config = RunConfig(tracing_disabled=True)
    answer = str((await Runner.run(OAI, question, run_config=config)).final_output)
    return await _twice(ctx, answer)


async def _twice(ctx: Any, answer: str) -> dict[str, Any]:
    first = await ctx.step("first", str, answer)
    await ctx.approval("again")
    return {"first": first, "again": answer}


FLOWS = {"pydantic_ai": replies_pai, "openai_agents": replies_oai}


def in_thread(fn: Any) -> Any:
    """``fn()`` in a thread of its own (its event loops end with it); re-raised."""
    found: list[Any] = []

    def target() -> None:
        try:
            found.append(("ok", fn()))
        except BaseException as exc:  # handed to the caller
            found.append(("raised", exc))
        finally:  # a run_sync leaves the thread's default loop open: close it
            try:
                asyncio.get_event_loop_policy().get_event_loop().close()
            except RuntimeError:  # no loop was set in this thread
                pass
            asyncio.set_event_loop(None)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    ((how, value),) = found
    if how == "raised":
        raise value
    return value


def exercise(framework: str, reply: list[tuple[Any, ...]]) -> dict[str, Any]:
    """Run ``reply`` through ``framework``'s adapter, approve, replay, verify.

    Returns ``{"outcome": "done" | error type, "answer", "error", "ran"}``;
    raises AssertionError if the replay read back another answer or asked the
    model again, if an error escaped that is not ninelives' own one-line one, or
    if ``verify`` finds anything."""
    REPLY[:] = reply
    RAN.clear()
    with tempfile.TemporaryDirectory() as folder:
        db = str(Path(folder) / "state.db")
        with ninelives.open(db) as rt:
            rt.create("t", FLOWS[framework], "q")
        found: dict[str, Any] = {"outcome": "done", "answer": None, "error": None}
        try:
            in_thread(lambda: _run(db))
            first_run = list(RAN)
            with ninelives.open(db) as rt:
                waiting = [s.idx for s in rt.status("t").steps if s.status.value == "waiting"]
                approve(rt.store, "t", waiting[0])
            in_thread(lambda: _run(db))
            assert RAN == first_run, f"the replay ran {RAN[len(first_run) :]}"
            with ninelives.open(db) as rt:
                result = rt.result("t")
            assert result["first"] == result["again"], result
            found["answer"] = result["again"]
        except NineLivesError as exc:
            found.update(outcome=type(exc).__name__, error=str(exc))
        assert "\n" not in (found["error"] or ""), found["error"]
        with ninelives.open(db) as rt:
            report = verify_store(rt.store)
        assert report.ok, report.violations
        found["ran"] = list(RAN)
        return found


def _run(db: str) -> None:
    with ninelives.open(db) as rt:
        try:
            rt.run("t")
        except TaskWaiting:
            pass
