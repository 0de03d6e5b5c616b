"""An OpenAI Agents SDK agent with two tools, as a user's module (copied into a lab).

Its scripted model asks for ``read_note`` and ``post_note`` in one response,
then answers with what they returned. Every model call and every tool
execution appends a line to ``$NOTES_LOG``; ``post_note`` publishes
``notes/<idem_key>.txt`` once. ``NOTES_DURABLE=0`` leaves the agent unwrapped
(the negative control); ``NOTES_APPROVE=1`` makes ``post_note``
``needs_approval=True``; ``NOTES_SLOW`` seconds delay its effect, ``NOTES_TIMEOUT``
bounds its calls and ``NOTES_REFUSE=1`` refuses to guess its outcome.
``NOTES_MODEL_VIA`` gives the scripted model per run instead of on the agent:
``run_config`` as ``RunConfig(model=...)``, ``provider`` through a
``RunConfig(model_provider=...)`` that resolves the agent's model name. The SDK
loads only when a workflow runs.
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


#: The scripted model's class, once :func:`build` made it (for :func:`run_config`).
SCRIPTED: list[Any] = []


def build() -> Any:
    from agents import Agent, Model, ModelResponse, Usage, function_tool
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
                i["output"]
                for i in items
                if isinstance(i, dict) and i.get("type") == "function_call_output"
            ]
            usage = Usage(requests=1, input_tokens=20, output_tokens=5, total_tokens=25)
            if not outputs:
                calls = [
                    ResponseFunctionToolCall(
                        type="function_call",
                        call_id=f"call_{n}",
                        name=name,
                        arguments=json.dumps(arguments),
                        id=f"fc_{n}",
                        status="completed",
                    )
                    for n, (name, arguments) in enumerate(
                        [
                            ("read_note", {"name": "a.txt"}),
                            ("post_note", {"text": "remember the milk"}),
                        ],
                        start=1,
                    )
                ]
                return ModelResponse(output=calls, usage=usage, response_id=None)
            text = "done: " + json.dumps(sorted(str(o) for o in outputs))
            message = ResponseOutputMessage(
                type="message", id="msg_1", role="assistant", status="completed",
                content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
            )  # fmt: skip
            return ModelResponse(output=[message], usage=usage, response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    @function_tool
    def read_note(name: str) -> str:
        """Read a note from the input folder."""
        log("tool:read_note")
        return Path("input", name).read_text(encoding="utf-8")

    @function_tool(needs_approval=os.environ.get("NOTES_APPROVE") == "1")
    def post_note(text: str) -> dict[str, Any]:
        """Post a note, once per step."""
        step = ninelives.current_step()
        key = step.idem_key if step is not None else "plain"
        log(f"tool:post_note {key}")
        time.sleep(float(os.environ.get("NOTES_SLOW", "0")))
        os.makedirs("notes", exist_ok=True)
        publish_once("notes", f"{key}.txt", text.encode())
        return {"posted": key}

    via = os.environ.get("NOTES_MODEL_VIA")
    model: Any = "scripted" if via == "provider" else None if via == "run_config" else Scripted()
    agent = Agent(name="notes", model=model, tools=[read_note, post_note])
    SCRIPTED[:] = [Scripted]
    return (
        durable(agent, tools=policies()) if os.environ.get("NOTES_DURABLE", "1") != "0" else agent
    )


def run_config() -> Any:
    from agents import ModelProvider, RunConfig

    via = os.environ.get("NOTES_MODEL_VIA")
    if via == "run_config":
        return RunConfig(model=SCRIPTED[0](), tracing_disabled=True)
    if via == "provider":

        class Provider(ModelProvider):
            def get_model(self, model_name: str | None) -> Any:
                assert model_name == "scripted", model_name
                return SCRIPTED[0]()

        return RunConfig(model_provider=Provider(), tracing_disabled=True)
    return RunConfig(tracing_disabled=True)


def report(answer: str) -> dict[str, Any]:
    log("report")
    return {"words": len(answer.split())}


@ninelives.workflow("notes_sync")
def notes_sync(ctx: Any, question: str) -> dict[str, Any]:
    from agents import Runner

    answer = Runner.run_sync(build(), question, run_config=run_config()).final_output
    return {"answer": answer, "report": ctx.step("report", report, answer)}


@ninelives.workflow("notes_async")
async def notes_async(ctx: Any, question: str) -> dict[str, Any]:
    from agents import Runner

    answer = (await Runner.run(build(), question, run_config=run_config())).final_output
    return {"answer": answer, "report": await ctx.step("report", report, answer)}


@ninelives.workflow("notes_wrapped_twice")
def notes_wrapped_twice(ctx: Any, question: str) -> dict[str, Any]:
    """The durable agent made durable again, as a handoff target made durable on its
    own is when the agent handing off to it is made durable."""
    from agents import Runner

    from ninelives.integrations.openai_agents import durable

    agent = durable(build(), tools=policies())
    answer = Runner.run_sync(agent, question, run_config=run_config()).final_output
    return {"answer": answer, "report": ctx.step("report", report, answer)}
