"""The hand-written agent loop of the docs, as a user's module (copied into a lab).

``lookup_note`` logs each execution to ``$NOTES_LOG``; ``write_artifact`` (built
in) publishes by the step's key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import ninelives
from ninelives.chat import tool_message
from ninelives.tools import tool


@tool(
    "lookup_note",
    schema={
        "type": "object",
        "properties": {"name": {"type": "string"}},
        "required": ["name"],
        "additionalProperties": False,
    },
)
def lookup_note(step_input: Any, ctx: Any, idem_key: str) -> dict[str, Any]:
    """Read a note from the input folder."""
    with open(os.environ.get("NOTES_LOG", "calls.log"), "a", encoding="utf-8") as f:
        f.write("tool:lookup_note\n")
    return {"text": Path("input", step_input["name"]).read_text(encoding="utf-8")}


@ninelives.workflow("notes_agent")
def notes_agent(ctx: Any, goal: str) -> str:
    messages = [{"role": "user", "content": goal}]
    for _ in range(8):
        reply = ctx.chat(messages, tools=["lookup_note", "write_artifact"])
        messages.append(
            {"role": "assistant", "content": reply["text"], "tool_calls": reply["tool_calls"]}
        )
        if not reply["tool_calls"]:
            return str(reply["text"])
        for call in reply["tool_calls"]:
            messages.append(tool_message(call, ctx.call_tool(call)))
    raise RuntimeError("no answer in 8 turns")


@ninelives.workflow("notes_agent_async")
async def notes_agent_async(ctx: Any, goal: str) -> str:
    messages = [{"role": "user", "content": goal}]
    for _ in range(8):
        reply = await ctx.chat(messages, tools=["lookup_note", "write_artifact"])
        messages.append(
            {"role": "assistant", "content": reply["text"], "tool_calls": reply["tool_calls"]}
        )
        if not reply["tool_calls"]:
            return str(reply["text"])
        for call in reply["tool_calls"]:
            messages.append(tool_message(call, await ctx.call_tool(call)))
    raise RuntimeError("no answer in 8 turns")
