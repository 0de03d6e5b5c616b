"""Model and tool calls: the one mechanism behind ``ctx.chat``, ``ctx.call_tool``,
the plan's ``agent`` section and the ``llm`` tool.

:func:`ask` asks the configured engine (``stub``, ``ollama``, ``openai``:
``NINELIVES_LLM*``) once, offering registered tools by their JSON Schemas, and
returns::

    {"text": str, "tool_calls": [{"id", "name", "arguments"}],
     "engine": str, "model": str, "usage": {"input_tokens", "output_tokens"}, "ms": float}

Each call it returns is checked (:func:`check_call`): a call to a tool not
offered, arguments that fail the tool's schema or its own check, or arguments
no store can keep (a number JSON lacks, nesting deeper than a step's input may)
carry an ``"error"`` beside the id, name and arguments (those last then ``{}``).
:func:`run_call` runs the tool a call names, or returns ``{"error": ...}``
when it cannot run: the result the model reads next, not a failed task.

Who uses it: a workflow's ``ctx.chat`` is one step named ``chat`` whose body is
:func:`ask`, and ``ctx.call_tool`` one named after the tool whose body is
:func:`run_call` (:mod:`ninelives.replay_chat`); the plan agent's turn is a
step whose body is :func:`ask` on the conversation rebuilt from committed
outputs, and each call :func:`ask` found runnable is appended as a step of
its tool (:mod:`ninelives.agent`); the ``llm`` tool is :func:`ask` offering
no tool (:mod:`ninelives.tools.model`).

Messages are the neutral shape of :mod:`ninelives.llm`, so a reply goes back
into the conversation as :func:`assistant_message` and a result as
:func:`tool_message`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .agentplan import check_callable as check_callable
from .agentplan import require_validator as require_validator
from .errors import InputError, PlanError, ToolError
from .models import MAX_DEPTH, nested_deeper

#: The step name of a model request made with ``ctx.chat``.
CHAT_STEP = "chat"
#: How deep a call's arguments may nest: they sit three levels into a reply
#: (``tool_calls``, the call, ``arguments``), which as an output nests at most MAX_DEPTH.
MAX_ARGUMENT_DEPTH = MAX_DEPTH - 3
_ROLES = ("system", "user", "assistant", "tool")
_TEXT_KEYS = ("text", "summary")


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
        from .names import ENGINES

        if request["engine"] not in ENGINES:
            raise InputError(f"chat: unknown engine {request['engine']!r} (known: {ENGINES})")
    return request


def check_offered(tools: Sequence[str], lookup: Callable[[str], Any]) -> None:
    """:func:`check_callable` for ``ctx.chat``: a tool it cannot offer is the
    workflow's mistake (:class:`~ninelives.errors.InputError`)."""
    try:
        check_callable(tools, lookup)
    except PlanError as exc:
        raise InputError(f"chat: {exc}") from None


def tool_definitions(names: Sequence[str], lookup: Callable[[str], Any]) -> list[dict[str, Any]]:
    """``{"name", "description", "parameters"}`` of each tool a model is offered."""
    found = []
    for name in names:
        tool = lookup(name)
        found.append(
            {
                "name": name,
                "description": getattr(tool, "description", "") or "",
                "parameters": getattr(tool, "schema", None) or {"type": "object"},
            }
        )
    return found


def ask(
    request: Mapping[str, Any],
    lookup: Callable[[str], Any],
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Ask the engine once: ``request`` holds ``messages`` (neutral shape),
    ``tools`` (names offered), and optionally ``system``, ``model`` and ``engine``
    (overriding ``NINELIVES_LLM*`` from ``env``). Returns the reply, each call
    checked against the tools offered; :class:`~ninelives.errors.ToolError` if
    the engine is misconfigured or gives no usable reply."""
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
        unusable = call.problem or argument_problem(call.arguments)
        if unusable:
            # Arguments no store or reader can keep are not kept: the error says why.
            entry["arguments"] = {}
            entry["error"] = f"arguments of {call.name!r} refused: {unusable}"
        elif problem := check_call(entry, offered, lookup):
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


def check_call(call: Any, offered: Sequence[str] | None, lookup: Callable[[str], Any]) -> str:
    """Why ``call`` cannot run, or '' when it can: a shape that is not a call, the
    error its reply recorded, a tool not among ``offered`` (None: any registered
    tool) or not registered or without a schema, or arguments that fail the
    tool's schema or its own check."""
    if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
        return "not a tool call: it needs a 'name' and 'arguments'"
    if call.get("error"):
        return str(call["error"])
    name, arguments = call["name"], call.get("arguments", {})
    if offered is not None and name not in offered:
        return f"unknown tool {name!r}: this agent may call {', '.join(offered) or 'no tool'}"
    try:
        tool = lookup(name)
    except PlanError:
        return f"unknown tool {name!r}"
    schema = getattr(tool, "schema", None)
    if schema is None:
        return f"tool {name!r} declares no input schema: a model can only call tools that do"
    if not isinstance(arguments, Mapping):
        return f"arguments of {name!r} must be an object"
    problem = schema_problem(schema, dict(arguments))
    if problem:
        return f"arguments of {name!r} do not match its schema: {problem}"
    check = getattr(tool, "validate", None)
    if check is not None:
        try:
            check(dict(arguments))
        except PlanError as exc:
            return f"arguments of {name!r} refused: {exc}"
    return ""


def run_call(
    call: Any, lookup: Callable[[str], Any], context: Any, *, awaited: bool = False
) -> Any:
    """Run the tool ``call`` names with its arguments, for the step ``context``
    (a :class:`~ninelives.tools.ToolContext`); ``{"error": ...}`` without running
    anything when it cannot run (:func:`check_call`). ``awaited``: the caller
    awaits what it returns, so an ``async def`` tool's coroutine is returned."""
    problem = check_call(call, None, lookup)
    if problem:
        return {"error": problem}
    tool = lookup(call["name"])
    return (tool.start if awaited else tool.run)(dict(call.get("arguments", {})), context)


def argument_problem(arguments: Any) -> str:
    """Why a call's decoded arguments cannot be stored as a step's input, or ''."""
    from .journal import dumps

    too_deep = f"they nest more than {MAX_ARGUMENT_DEPTH} levels deep"
    try:
        text = dumps(arguments)
    except RecursionError:
        return too_deep
    except (TypeError, ValueError):
        return "they hold a number JSON cannot store (NaN, Infinity, or out of range: 1e999)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "they hold text that is not valid Unicode (a lone surrogate)"
    return too_deep if nested_deeper(text, MAX_ARGUMENT_DEPTH) else ""


_COMPILED: dict[str, Callable[[Any], Any]] = {}


def schema_problem(schema: Mapping[str, Any], value: Any) -> str:
    """Why ``value`` fails ``schema`` (JSON Schema, checked by fastjsonschema), or ''."""
    fastjsonschema = require_validator()
    key = json.dumps(schema, sort_keys=True)
    check = _COMPILED.get(key)
    if check is None:
        check = _COMPILED[key] = fastjsonschema.compile(dict(schema))
    try:
        check(value)
    except fastjsonschema.JsonSchemaException as exc:
        return str(exc.message)
    return ""


def shown_outputs(refs: Sequence[int], ctx: Mapping[int, Any]) -> list[str]:
    """The committed outputs of steps ``refs`` as a model is shown them, one
    ``Output of step N:`` part each (:class:`ToolError` for one not committed)."""
    parts = []
    for ref in refs:
        if ref not in ctx:
            raise ToolError(f"step {ref} has no committed output")
        parts.append(f"Output of step {ref}:\n{context_text(ctx[ref])}")
    return parts


def context_text(output: Any) -> str:
    """What a model is shown of a step's output: its text, else its JSON."""
    if isinstance(output, Mapping):
        for key in _TEXT_KEYS:
            if isinstance(output.get(key), str):
                return str(output[key])
    return json.dumps(output, ensure_ascii=False, sort_keys=True)


def assistant_message(reply: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant message that puts ``reply`` (of :func:`ask`) back into the
    conversation: its text and each call's id, name and arguments."""
    calls = reply.get("tool_calls") or []
    return {
        "role": "assistant",
        "content": reply.get("text") or "",
        "tool_calls": [
            {"id": c["id"], "name": c["name"], "arguments": c["arguments"]} for c in calls
        ],
    }


def tool_message(call: Mapping[str, Any], result: Any) -> dict[str, Any]:
    """The tool message that answers ``call`` with ``result``, in the neutral
    shape: ``{"error": why}`` reads ``error: why``, anything else its JSON."""
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
