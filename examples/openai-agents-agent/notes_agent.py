"""An OpenAI Agents SDK agent that survives SIGKILL: read the notes, post a summary once.

The agent has two tools, ``read_notes`` and ``post_summary`` (which publishes
``posted/<idem_key>.md`` once per step: kill it anywhere and the summary is
still posted once). Its model is a scripted one unless ``NOTES_MODEL`` names
one served by an OpenAI-compatible server at ``NOTES_MODEL_URL`` (Ollama's
``http://127.0.0.1:11434/v1`` by default).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agents import Agent, Model, ModelResponse, RunConfig, Runner, Usage, function_tool
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import ninelives
from ninelives.integrations.openai_agents import durable
from ninelives.tools.effects import publish_once


class Scripted(Model):
    """Read the notes, post their first line, then say so."""

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> Any:
        items = input if isinstance(input, list) else []
        outputs = [i["output"] for i in items if i.get("type") == "function_call_output"]
        usage = Usage(requests=1, input_tokens=len(str(input).split()), output_tokens=8)
        if len(outputs) < 2:
            name, arguments = ("read_notes", "{}")
            if outputs:
                summary = str(outputs[0]).splitlines()[0].replace('"', "'")
                name, arguments = ("post_summary", f'{{"text": "{summary}"}}')
            call = ResponseFunctionToolCall(
                type="function_call", call_id=name, name=name, arguments=arguments
            )
            return ModelResponse(output=[call], usage=usage, response_id=None)
        said = "Posted the summary." if "posted" in str(outputs[1]) else f"Not posted: {outputs[1]}"
        text = ResponseOutputText(type="output_text", text=said, annotations=[])
        message = ResponseOutputMessage(
            type="message", id="answer", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the scripted model does not stream")


def model() -> Any:
    name = os.environ.get("NOTES_MODEL")
    if not name:
        return Scripted()
    from agents import OpenAIChatCompletionsModel
    from openai import AsyncOpenAI

    url = os.environ.get("NOTES_MODEL_URL", "http://127.0.0.1:11434/v1")
    client = AsyncOpenAI(base_url=url, api_key=os.environ.get("NOTES_MODEL_API_KEY", "local"))
    return OpenAIChatCompletionsModel(model=name, openai_client=client)


@function_tool
def read_notes() -> str:
    """The text of input/notes.txt."""
    return Path("input/notes.txt").read_text(encoding="utf-8")


# NOTES_APPROVE=1: a person approves each post (`ninelives approve TASK STEP`).
@function_tool(needs_approval=os.environ.get("NOTES_APPROVE") == "1")
def post_summary(text: str) -> dict[str, str]:
    """Post a one-line summary (once per step, by its idempotency key)."""
    step = ninelives.current_step()
    key = step.idem_key if step is not None else "outside-a-workflow"
    os.makedirs("posted", exist_ok=True)
    publish_once("posted", f"{key}.md", text.encode("utf-8"))
    return {"posted": f"posted/{key}.md"}


agent = durable(  # the one line: every model and tool call a step
    Agent(
        name="notes",
        instructions="Read the notes with read_notes, post a one-line summary with post_summary.",
        model=model(),
        tools=[read_notes, post_summary],
    )
)


@ninelives.workflow("notes")
def notes(ctx: Any, question: str) -> str:
    run = Runner.run_sync(agent, question, run_config=RunConfig(tracing_disabled=True))
    return str(run.final_output)
