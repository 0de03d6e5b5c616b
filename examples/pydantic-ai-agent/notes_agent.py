"""A Pydantic AI agent that survives SIGKILL: read the notes, post a summary once.

The agent has two tools, ``read_notes`` and ``post_summary`` (which publishes
``posted/<idem_key>.md`` once per step: kill it anywhere and the summary is
still posted once). Its model is a scripted ``FunctionModel`` unless
``NOTES_MODEL`` names one served by an OpenAI-compatible server at
``NOTES_MODEL_URL`` (Ollama's ``http://127.0.0.1:11434/v1`` by default).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import ninelives
from ninelives.integrations.pydantic_ai import NinelivesDurability
from ninelives.tools.effects import publish_once


def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Read the notes, post their first line, then say so."""
    returns = [p.content for m in messages for p in m.parts if p.part_kind == "tool-return"]
    if not returns:
        return ModelResponse(parts=[ToolCallPart("read_notes", {}, tool_call_id="read")])
    if len(returns) == 1:
        summary = str(returns[0]).splitlines()[0]
        return ModelResponse(parts=[ToolCallPart("post_summary", {"text": summary}, "post")])
    if not isinstance(returns[1], dict):  # a person said no: the note is what comes back
        return ModelResponse(parts=[TextPart(f"Not posted: {returns[1]}")])
    return ModelResponse(parts=[TextPart(f"Posted the summary as {returns[1]['posted']}.")])


def model() -> Any:
    name = os.environ.get("NOTES_MODEL")
    if not name:
        return FunctionModel(scripted)
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    url = os.environ.get("NOTES_MODEL_URL", "http://127.0.0.1:11434/v1")
    key = os.environ.get("NOTES_MODEL_API_KEY", "local")
    return OpenAIChatModel(name, provider=OpenAIProvider(base_url=url, api_key=key))


agent = Agent(
    model(),
    name="notes",
    instructions="Read the notes with read_notes, post a one-line summary with post_summary.",
    capabilities=[NinelivesDurability()],  # the one line: every model and tool call a step
)


@agent.tool_plain
def read_notes() -> str:
    """The text of input/notes.txt."""
    return Path("input/notes.txt").read_text(encoding="utf-8")


# NOTES_APPROVE=1: a person approves each post (`ninelives approve TASK STEP`).
@agent.tool_plain(requires_approval=os.environ.get("NOTES_APPROVE") == "1")
def post_summary(text: str) -> dict[str, str]:
    """Post a one-line summary (once per step, by its idempotency key)."""
    step = ninelives.current_step()
    key = step.idem_key if step is not None else "outside-a-workflow"
    os.makedirs("posted", exist_ok=True)
    publish_once("posted", f"{key}.md", text.encode("utf-8"))
    return {"posted": f"posted/{key}.md"}


@ninelives.workflow("notes")
def notes(ctx: Any, question: str) -> str:
    return str(agent.run_sync(question).output)
