"""The model tools: ``llm`` (one request) and ``agent`` (one turn of an agent).

``llm``:

``{"prompt": str, "from": [0, 2], "system": str, "engine": str, "model": str}``
-> ``{"text", "engine", "model", "usage": {"input_tokens", "output_tokens"}, "ms"}``.
The committed outputs of the steps named by ``from`` (an index or a list)
go to the model as context, before the prompt. ``engine`` and ``model``
override ``NINELIVES_LLM`` and ``NINELIVES_LLM_MODEL`` for this step.

``agent`` is the step kind of an agent's turn (see :mod:`ninelives.agent`);
plans do not name it, their ``agent`` section does.

Like every step, a model call is at-least-once: a call whose step was killed
before its ``done`` commit is asked again, and one committed is never asked again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..chat import ask, shown_outputs
from ..errors import PlanError
from . import Tool


def _refs(step_input: Mapping[str, Any]) -> list[int]:
    ref = step_input.get("from", [])
    return list(ref) if isinstance(ref, list) else [ref]


def validate(step_input: Mapping[str, Any]) -> None:
    """Refuse at ``create`` an input the tool can never accept."""
    if not isinstance(step_input.get("prompt"), str) or not step_input["prompt"].strip():
        raise PlanError("input needs 'prompt', a non-empty string")
    for key in ("system", "engine", "model"):
        if key in step_input and not isinstance(step_input[key], str):
            raise PlanError(f"input '{key}' must be a string")
    if "engine" in step_input:
        from ..names import ENGINES

        if step_input["engine"] not in ENGINES:
            known = ", ".join(ENGINES)
            raise PlanError(f"unknown engine {step_input['engine']!r} (known: {known})")


def messages_for(step_input: Mapping[str, Any], ctx: Mapping[int, Any]) -> list[dict[str, Any]]:
    """The conversation one ``llm`` step sends: an optional system message, then
    one user message with each named output and the prompt."""
    parts = [*shown_outputs(_refs(step_input), ctx), step_input["prompt"]]
    messages: list[dict[str, Any]] = []
    if step_input.get("system"):
        messages.append({"role": "system", "content": step_input["system"]})
    messages.append({"role": "user", "content": "\n\n".join(parts)})
    return messages


def make_llm(env: Mapping[str, str] | None = None) -> Tool:
    """The ``llm`` tool, configured from ``env`` (default: the process environment)
    at each call, so a resumed run uses the engine configured now."""

    def llm(step_input: Mapping[str, Any], ctx: Mapping[int, Any], idem_key: str) -> Any:
        validate(step_input)
        request = {
            "messages": messages_for(step_input, ctx),
            "tools": [],
            **{k: step_input[k] for k in ("engine", "model") if step_input.get(k)},
        }
        reply = ask(request, _no_tool, env)
        del reply["tool_calls"]  # none were offered: an engine's stray calls are not kept
        return reply

    return Tool(name="llm", fn=llm, validate=validate)


def _no_tool(name: str) -> Any:
    raise PlanError(f"unknown tool {name!r}: an llm step offers no tool")


def make_agent(lookup: Callable[[str], Any], env: Mapping[str, str] | None = None) -> Tool:
    """The ``agent`` tool: one model turn; ``lookup`` finds the tools it may call."""
    from ..agent import run_turn

    def agent(step_input: Mapping[str, Any], ctx: Mapping[int, Any], idem_key: str) -> Any:
        idx = int(idem_key.rpartition("-")[2])
        return run_turn(step_input, ctx, idx, lookup, env)

    return Tool(name="agent", fn=agent, validate=_check_turn)


def _check_turn(step_input: Mapping[str, Any]) -> None:
    if not isinstance(step_input.get("turn"), int) or not isinstance(step_input.get("tools"), list):
        raise PlanError("an agent turn is made from a plan's 'agent' section, not written by hand")
