"""Model and tool calls in a workflow: what ``ctx.chat`` and ``ctx.call_tool`` run.

``ctx.chat(messages, tools=..., system=..., model=..., engine=...)`` is one
durable step named ``chat`` that asks the configured engine (``stub``,
``ollama``, ``openai``: ``NINELIVES_LLM*`` as for the plan agent) once and
returns::

    {"text": str, "tool_calls": [{"id", "name", "arguments"}],
     "engine": str, "model": str, "usage": {"input_tokens", "output_tokens"}, "ms": float}

``tools`` names registered tools; each must declare a JSON Schema, which the
model is shown. A call the model makes to a tool it was not offered, or with
arguments that fail that schema, carries an ``"error"`` beside its id, name and
arguments. ``ctx.call_tool(call)`` then runs the tool a call names as a durable
step named after the tool: a call with an error (or one that fails the checks
again: an unknown tool, arguments against the schema) runs nothing and returns
``{"error": ...}``, the result the model reads next; it does not fail the task.
The plan agent (:mod:`ninelives.agent`) checks calls with the same functions.

Messages are the neutral shape of :mod:`ninelives.llm`, so a reply goes back
into the conversation as ``{"role": "assistant", "content": reply["text"],
"tool_calls": reply["tool_calls"]}`` and a result as :func:`tool_message`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .errors import InputError, PlanError, ToolError

if TYPE_CHECKING:
    from .runtime import Runtime

#: The step name of a model request made with ``ctx.chat``.
CHAT_STEP = "chat"
_ROLES = ("system", "user", "assistant", "tool")


def chat_request(
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[str] = (),
    system: str | None = None,
    model: str | None = None,
    engine: str | None = None,
) -> dict[str, Any]:
    """The request ``ctx.chat`` journals as its step's input, shape-checked.

    A malformed request is the workflow's own mistake, not the model's: it
    raises :class:`~ninelives.errors.InputError` before any step is made.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InputError("chat: messages must be a list of {'role', 'content'} objects")
    checked = []
    for n, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in _ROLES:
            raise InputError(f"chat: message {n} needs a 'role' among {', '.join(_ROLES)}")
        checked.append(dict(message))
    if isinstance(tools, str) or not all(isinstance(t, str) and t for t in tools):
        raise InputError("chat: tools must be a list of registered tool names")
    request: dict[str, Any] = {"messages": checked, "tools": list(tools)}
    for key, value in (("system", system), ("model", model), ("engine", engine)):
        if value is not None and not isinstance(value, str):
            raise InputError(f"chat: {key} must be a string")
        if value:
            request[key] = value
    if request.get("engine"):
        from .llm import ENGINES

        if request["engine"] not in ENGINES:
            raise InputError(f"chat: unknown engine {request['engine']!r} (known: {ENGINES})")
    return request


def check_offered(tools: Sequence[str], lookup: Callable[[str], Any]) -> None:
    """Every tool offered to a model is registered and declares a JSON Schema
    (:class:`~ninelives.errors.InputError` if not: the workflow's mistake)."""
    from .agent import check_callable

    try:
        check_callable(tools, lookup)
    except PlanError as exc:
        raise InputError(f"chat: {exc}") from None


def ask(
    request: Mapping[str, Any],
    lookup: Callable[[str], Any],
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Ask the engine once (the body of a ``chat`` step): the reply, each call
    checked against the tools offered."""
    from .agent import check_call, tool_definitions
    from .llm import EngineConfig, open_engine

    overrides = {k: request[k] for k in ("engine", "model") if request.get(k)}
    try:
        config = EngineConfig.from_env(env, **overrides)
    except InputError as exc:
        raise ToolError(str(exc)) from None
    offered = list(request.get("tools", []))
    messages = list(request["messages"])
    if request.get("system"):
        messages.insert(0, {"role": "system", "content": request["system"]})
    reply = open_engine(config).chat(messages, tool_definitions(offered, lookup))
    calls = []
    for call in reply.tool_calls:
        entry: dict[str, Any] = call.as_message()
        problem = check_call(call.name, call.arguments, offered, lookup)
        if problem:
            entry["error"] = problem
        calls.append(entry)
    return {
        "text": reply.text,
        "tool_calls": calls,
        "engine": reply.engine,
        "model": reply.model,
        "usage": reply.usage(),
        "ms": reply.ms,
    }


def call_problem(call: Any, lookup: Callable[[str], Any]) -> str:
    """Why ``call`` cannot run, or '' when it can: the error its ``chat`` step
    recorded, a shape that is not a call, an unknown tool, or arguments that fail
    the tool's schema or its own check."""
    from .agent import check_call

    if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
        return "not a tool call: it needs a 'name' and 'arguments'"
    if call.get("error"):
        return str(call["error"])
    name, arguments = call["name"], call.get("arguments", {})
    try:
        tool = lookup(name)
    except PlanError:
        return f"unknown tool {name!r}"
    if getattr(tool, "schema", None) is None:
        return f"tool {name!r} declares no input schema: a model can only call tools that do"
    if not isinstance(arguments, Mapping):
        return f"arguments of {name!r} must be an object"
    return check_call(name, dict(arguments), [name], lookup)


def step_name(call: Any) -> str:
    """The name of the step that runs ``call``: its tool's name, or ``call`` for a
    name no step can take (a model may answer anything)."""
    import re

    from .durable import NAME_PATTERN
    from .models import AGENT_TOOL, APPROVAL_TOOL

    name = call.get("name") if isinstance(call, Mapping) else None
    valid = isinstance(name, str) and re.fullmatch(NAME_PATTERN, name) is not None
    return name if valid and name not in (AGENT_TOOL, APPROVAL_TOOL) else "call"  # type: ignore[return-value]


def tool_message(call: Mapping[str, Any], result: Any) -> dict[str, Any]:
    """The tool message that answers ``call`` with ``result``, in the neutral shape."""
    if isinstance(result, Mapping) and set(result) == {"error"}:
        content = f"error: {result['error']}"
    else:
        content = json.dumps(result, ensure_ascii=False, sort_keys=True)
    return {
        "role": "tool",
        "tool_call_id": str(call.get("id") or ""),
        "name": str(call.get("name") or ""),
        "content": content,
    }


def run_call(call: Any, lookup: Callable[[str], Any]) -> Any:
    """Run the tool ``call`` names (the body of a ``ctx.call_tool`` step), in the
    step's context; ``{"error": ...}`` without running anything when it cannot run."""
    from .durable import current_step

    problem = call_problem(call, lookup)
    if problem:
        return {"error": problem}
    context = current_step()
    assert context is not None  # a ctx.call_tool step sets it
    return lookup(call["name"]).run(dict(call.get("arguments", {})), context)


def _policy(call: Any, lookup: Callable[[str], Any], fn: Callable[..., Any]) -> Any:
    """``fn`` as a step with the outcome mode the called tool declares (``probe``,
    ``refuse``): a tool that must not run twice is not rerun after a kill."""
    from .durable import step

    try:
        tool = lookup(step_name(call))
    except PlanError:
        return fn
    if tool.on_unknown == "rerun":
        return fn
    arguments = dict(call.get("arguments") or {}) if isinstance(call, Mapping) else {}

    def probe(context: Any) -> Any:
        return tool.ask_probe(arguments, context)

    policy: dict[str, Any] = {"on_unknown": tool.on_unknown}
    if tool.probe is not None:
        policy["probe"] = probe
    return step(step_name(call), **policy)(fn)


class ChatCalls:
    """``ctx.chat`` and ``ctx.call_tool`` of a workflow's context (a mixin of
    :class:`~ninelives.replay.WorkflowContext`, whose ``step`` they call)."""

    _rt: Runtime | None

    def _lookup(self) -> Callable[[str], Any]:
        if self._rt is None:  # replay-check runs no step: nothing is looked up
            return lambda name: None
        return self._rt.tools.lookup

    def _chat_step(self, messages: Any, tools: Any, **choices: Any) -> tuple[Any, ...]:
        request = chat_request(messages, tools=tools, **choices)
        lookup = self._lookup()
        if self._rt is not None:
            check_offered(request["tools"], lookup)
        return CHAT_STEP, lambda req: ask(req, lookup), request

    def _call_step(self, call: Any) -> tuple[Any, ...]:
        lookup = self._lookup()
        fn = _policy(call, lookup, lambda c: run_call(c, lookup))
        given = dict(call) if isinstance(call, Mapping) else call
        return step_name(call), fn, given

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[str] = (),
        system: str | None = None,
        model: str | None = None,
        engine: str | None = None,
    ) -> dict[str, Any]:
        """One durable model request: ``{"text", "tool_calls", "engine", "model",
        "usage", "ms"}``; a committed reply is never asked again (see :mod:`ninelives.chat`)."""
        step: Any = self.step  # type: ignore[attr-defined]
        name, fn, request = self._chat_step(
            messages, tools, system=system, model=model, engine=engine
        )
        return step(name, fn, request)  # type: ignore[no-any-return]

    def call_tool(self, call: Mapping[str, Any]) -> Any:
        """Run the registered tool a model's ``call`` names as a durable step named
        after it; a call that cannot run returns ``{"error": ...}`` instead."""
        step: Any = self.step  # type: ignore[attr-defined]
        return step(*self._call_step(call))


class AsyncChatCalls(ChatCalls):
    """The awaited ``ctx.chat`` and ``ctx.call_tool`` of an async workflow."""

    async def chat(  # type: ignore[override]
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[str] = (),
        system: str | None = None,
        model: str | None = None,
        engine: str | None = None,
    ) -> dict[str, Any]:
        """As :meth:`ChatCalls.chat`, awaited."""
        step: Any = self.step  # type: ignore[attr-defined]
        name, fn, request = self._chat_step(
            messages, tools, system=system, model=model, engine=engine
        )
        return await step(name, fn, request)  # type: ignore[no-any-return]

    async def call_tool(self, call: Mapping[str, Any]) -> Any:
        """As :meth:`ChatCalls.call_tool`, awaited."""
        step: Any = self.step  # type: ignore[attr-defined]
        return await step(*self._call_step(call))
