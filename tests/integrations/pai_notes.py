"""A Pydantic AI agent with two tools, as a user's module (copied into a lab).

Its scripted model (``FunctionModel``) asks for ``read_note`` and ``post_note``
in one response, then answers with what they returned. Every model call and
every tool execution appends a line to ``$NOTES_LOG``, so a test counts what
ran; ``post_note`` publishes ``notes/<idem_key>.txt`` once. ``NOTES_DURABLE=0``
builds the agent without the capability (the negative control);
``NOTES_APPROVE=1`` declares ``post_note`` ``requires_approval=True``; ``NOTES_SLOW``
seconds delay its effect, ``NOTES_TIMEOUT`` bounds its calls and ``NOTES_REFUSE=1``
refuses to guess its outcome. The frameworks load only when a workflow runs:
``create`` stays cheap.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import ninelives
from ninelives.tools.effects import publish_once


def log(line: str) -> None:
    with open(os.environ.get("NOTES_LOG", "calls.log"), "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def policies() -> dict[str, Any]:
    """``post_note``'s step policy: ``$NOTES_TIMEOUT`` seconds, two attempts, no wait;
    ``NOTES_REFUSE=1``: ``on_unknown: refuse``."""
    policy: dict[str, Any] = {}
    if os.environ.get("NOTES_REFUSE") == "1":
        policy["on_unknown"] = "refuse"
    timeout = os.environ.get("NOTES_TIMEOUT")
    if timeout:
        policy.update(timeout=float(timeout), max_attempts=2, backoff=False)
    return {"post_note": policy} if policy else {}


def build() -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from ninelives.integrations.pydantic_ai import NinelivesDurability

    def script(messages: list[Any], info: AgentInfo) -> ModelResponse:
        log("model")
        if not any(m.kind == "response" for m in messages):
            return ModelResponse(
                parts=[
                    ToolCallPart("read_note", {"name": "a.txt"}, tool_call_id="call_1"),
                    ToolCallPart("post_note", {"text": "remember the milk"}, tool_call_id="call_2"),
                ]
            )
        returns = [p.content for m in messages for p in m.parts if p.part_kind == "tool-return"]
        return ModelResponse(parts=[TextPart("done: " + json.dumps(returns, sort_keys=True))])

    durable = os.environ.get("NOTES_DURABLE", "1") != "0"
    agent = Agent(
        FunctionModel(script),
        name="notes",
        capabilities=[NinelivesDurability(tools=policies())] if durable else [],
    )

    @agent.tool_plain
    def read_note(name: str) -> str:
        """Read a note from the input folder."""
        log("tool:read_note")
        return Path("input", name).read_text(encoding="utf-8")

    @agent.tool_plain(requires_approval=os.environ.get("NOTES_APPROVE") == "1")
    def post_note(text: str) -> dict[str, Any]:
        """Post a note, once per step."""
        step = ninelives.current_step()
        key = step.idem_key if step is not None else "plain"
        log(f"tool:post_note {key}")
        time.sleep(float(os.environ.get("NOTES_SLOW", "0")))
        os.makedirs("notes", exist_ok=True)
        publish_once("notes", f"{key}.txt", text.encode())
        return {"posted": key}

    return agent


def report(answer: str) -> dict[str, Any]:
    log("report")
    return {"words": len(answer.split())}


@ninelives.workflow("notes_sync")
def notes_sync(ctx: Any, question: str) -> dict[str, Any]:
    answer = build().run_sync(question).output
    return {"answer": answer, "report": ctx.step("report", report, answer)}


@ninelives.workflow("notes_async")
async def notes_async(ctx: Any, question: str) -> dict[str, Any]:
    answer = (await build().run(question)).output
    return {"answer": answer, "report": await ctx.step("report", report, answer)}
