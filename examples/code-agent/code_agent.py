"""A code-first agent: a plain Python loop of model calls and tool calls, made durable.

Load it with ``--tools code_agent`` (or ``NINELIVES_TOOLS=code_agent``) from
this folder, then ``ninelives create report --workflow report_agent --args
'["Summarize the notes for the team"]'`` and ``ninelives run report``.

Every model call and every tool call is a step: kill the run anywhere and run
it again, and the function replays from the top, answering each finished step
from the journal. A committed model turn is never asked again; the report is
published under the step's idempotency key, so a step killed after publishing
and run again publishes nothing twice.
"""

from __future__ import annotations

import json
import os
from typing import Any

import ninelives
from ninelives.llm import EngineConfig, open_engine
from ninelives.tools.effects import artifacts_folder, publish_once

SYSTEM = "You write short reports. Publish the report with write_artifact, then answer."
#: What the model is offered: ``write_artifact(name, text)``.
TOOLS = [
    {
        "name": "write_artifact",
        "description": "Publish a Markdown report as an artifact.",
        "parameters": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "text": {"type": "string"}},
            "required": ["name", "text"],
        },
    }
]


def read_notes(folder: str) -> str:
    """Every ``.md`` file under ``folder``, in name order, as one text."""
    parts = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".md"):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                parts.append(f.read())
    return "\n".join(parts)


@ninelives.step(name="model", max_attempts=3, backoff={"base": 1, "cap": 30})
def ask_model(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One model turn (the engine of ``NINELIVES_LLM``: ``stub`` needs no model)."""
    reply = open_engine(EngineConfig.from_env()).chat(messages, TOOLS)
    return {
        "text": reply.text,
        "calls": [call.as_message() for call in reply.tool_calls],
        "model": f"{reply.engine}:{reply.model}",
        "tokens": reply.usage(),
    }


@ninelives.step(name="write_artifact")
def write_artifact(name: str, text: str) -> dict[str, Any]:
    """Publish ``text`` once in outcome, as ``<idem_key>.md`` (the model's ``name`` is
    recorded beside it): a step run again after a kill finds its file there and
    publishes nothing twice.
    ``CODE_AGENT_UNSAFE=1`` appends to ``report.log`` instead, ignoring the key:
    the deliberate bug that the kill tests' negative control must catch."""
    step = ninelives.current_step()
    assert step is not None  # a durable step: only ever called inside the workflow
    folder = artifacts_folder()
    if os.environ.get("CODE_AGENT_UNSAFE") == "1":
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "report.log"), "a", encoding="utf-8") as log:
            log.write(text + "\n")
        return {"path": os.path.join(folder, "report.log")}
    done = publish_once(folder, f"{step.idem_key}.md", text.encode(), step=step.step)
    return {"name": name, "path": done.path, "sha256": done.sha256, "bytes": done.size}


def call_tool(call: dict[str, Any]) -> dict[str, Any]:
    """Run one tool call of the model: a wrong name or arguments is the model's
    mistake, answered as its next turn's input rather than failing the task."""
    args = call.get("arguments") or {}
    if call.get("name") != "write_artifact":
        return {"error": f"no tool {call.get('name')!r}"}
    if not isinstance(args.get("name"), str) or not isinstance(args.get("text"), str):
        return {"error": "write_artifact takes a string name and a string text"}
    return write_artifact(args["name"], args["text"])


@ninelives.workflow("report_agent", version="1")
def report_agent(ctx: Any, goal: str, max_turns: int = 6) -> dict[str, Any]:
    """Read the notes, then let the model call tools until it answers."""
    notes = ctx.step("read_notes", read_notes, "input")
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"{goal}\n\n{notes}"},
    ]
    for turn in range(max_turns):
        reply = ask_model(messages)
        messages.append(
            {"role": "assistant", "content": reply["text"], "tool_calls": reply["calls"]}
        )
        if not reply["calls"]:
            return {"answer": reply["text"], "turns": turn + 1}
        for call in reply["calls"]:
            result = call_tool(call)
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "name": call["name"],
                    "content": json.dumps(result),
                }
            )
    return {"answer": None, "turns": max_turns}
