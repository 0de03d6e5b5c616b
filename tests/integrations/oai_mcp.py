"""An OpenAI Agents SDK agent whose tool comes from an MCP server (copied into a lab).

The agent's scripted model asks for ``post_note`` once, then answers. The tool
is served by ``mcp_notes.py`` over stdio, a process of its own that the SDK
starts; it appends ``tool:post_note`` to ``$NOTES_LOG`` each time it runs, as
the model appends ``model``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import ninelives


def log(line: str) -> None:
    with open(os.environ.get("NOTES_LOG", "calls.log"), "a", encoding="utf-8") as f:
        f.write(line + "\n")


def build() -> Any:
    from agents import Agent, Model, ModelResponse, Usage
    from agents.mcp import MCPServerStdio
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    from ninelives.integrations.openai_agents import durable

    class Scripted(Model):
        async def get_response(
            self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
        ) -> Any:
            log("model")
            items = input if isinstance(input, list) else []
            outputs = [
                str(i["output"])
                for i in items
                if isinstance(i, dict) and i.get("type") == "function_call_output"
            ]
            usage = Usage(requests=1, input_tokens=20, output_tokens=5, total_tokens=25)
            if not outputs:
                call = ResponseFunctionToolCall(
                    type="function_call", call_id="call_1", name="post_note",
                    arguments='{"text": "remember the milk"}', id="fc_1", status="completed",
                )  # fmt: skip
                return ModelResponse(output=[call], usage=usage, response_id=None)
            message = ResponseOutputMessage(
                type="message", id="msg_1", role="assistant", status="completed",
                content=[ResponseOutputText(
                    type="output_text", text="done: " + outputs[0], annotations=[]
                )],
            )  # fmt: skip
            return ModelResponse(output=[message], usage=usage, response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    server = MCPServerStdio(
        params={
            "command": sys.executable,
            "args": [str(Path("mcp_notes.py").resolve())],
            "env": {"NOTES_LOG": str(Path(os.environ.get("NOTES_LOG", "calls.log")).resolve())},
        },
        cache_tools_list=True,
    )
    return server, durable(Agent(name="notes", model=Scripted(), mcp_servers=[server]))


@ninelives.workflow("notes_mcp")
async def notes_mcp(ctx: Any, question: str) -> str:
    from agents import RunConfig, Runner

    server, agent = build()
    async with server:
        result = await Runner.run(agent, question, run_config=RunConfig(tracing_disabled=True))
    return str(result.final_output)
