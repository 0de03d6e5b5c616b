"""OpenAI Agents SDK agents that survive SIGKILL: wrap the agent, keep the Runner.

::

    from agents import Agent, Runner
    from ninelives.integrations.openai_agents import durable

    agent = durable(Agent(name="notes", model=model, tools=[get_note, post_note]))

    @ninelives.workflow("notes")
    def notes(ctx, question):
        return Runner.run_sync(agent, question).final_output   # or `await Runner.run(...)`

:func:`durable` returns a copy of the agent whose model and function tools
ninelives wraps, through the SDK's own extension points: a
:class:`~agents.models.interface.Model` that delegates to the agent's model,
and each :class:`~agents.FunctionTool` with its ``on_invoke_tool`` wrapped (the
places the SDK's Temporal integration puts its activities). Inside a ninelives
workflow each model call is a durable step named ``model:<agent name>``,
read back through the SDK's own types and never asked again, and each
function-tool call a step named ``tool:<tool name>`` whose JSON result is
never computed again; a tool function sees ``ninelives.current_step()`` and
its ``idem_key``. Handoff agents are wrapped too. Outside a workflow, and
inside a step of one, the agent behaves exactly as the one it was made from.
A model the run's ``RunConfig`` gives (``model=``, or an agent's model name
resolved by ``model_provider=``) is durable too, and so are the function tools
the SDK lists for a turn, an MCP server's among them. No extension point sees
either choice, so these two go beyond the SDK's public surface: the run loop's
``get_model`` and ``get_all_tools`` are wrapped at import (for agents made by
:func:`durable` only; every other agent gets the SDK's own answer), which is why
the SDK version is pinned to the minor release the tests run.

Tool calls of one model response run one at a time, in the order the tasks
the SDK starts for them reach the tool; the result a replay hands a call is
checked against its call id, so a replay that met them in another order stops
with an error instead of giving one call another's result. A tool error the
SDK turns into a message for the model (its default ``failure_error_function``)
is that call's committed result, as the model read it; a tool made with
``failure_error_function=None`` raises instead, a ``step_error`` retried by the
step policy given for it in ``tools=``. Streamed runs (``Runner.run_streamed``)
are not durable: inside a workflow they are refused.

Approval: a function tool with ``needs_approval`` (a bool or the SDK's
callable) does not interrupt the run inside a workflow (no
``RunResult.interruptions``, no ``RunState.approve``): the call parks the task on
a ninelives approval step ``approve:<tool name>`` before its tool step (``run``
exits 8); ``ninelives approve TASK STEP`` lets the run go on and the tool runs
as its step; ``--reject --note TEXT`` makes TEXT (or the SDK's own rejection
message) the call's output, which the model reads, and the run goes on.
Outside a workflow the SDK's own interruptions are unchanged. The SDK itself
asks for approval, before any ninelives code runs, when a call's arguments are
not a JSON object it can read (not JSON, ``NaN``, an array): such a call of an
approval tool ends the run with the SDK's ``interruptions`` inside a workflow
too (the tool does not run); check ``result.interruptions``. Empty arguments
(``""``, which the SDK runs as ``{}``) are stored as ``{}`` and ask the step.

Replies: a model response is stored with lone surrogates replaced by U+FFFD
(also escaped ones in call arguments) and call arguments nesting past 29 levels
replaced by a note that is not JSON (the call's error, as in the plan's agent),
so a replay reads back what the SDK can parse. A call of a tool the agent lacks
ends the run with the SDK's own error (exit 12), as it ends the SDK's runs.

Tested with ``openai-agents`` in :data:`SUPPORTED`; importing this module with
another version raises :class:`~ninelives.integrations.FrameworkVersionError`.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from . import require

#: The ``openai-agents`` releases this module is tested with: ``>=`` first, ``<`` second.
SUPPORTED = ("0.24", "0.25")
require("openai-agents", *SUPPORTED, extra="openai-agents")

from agents import (  # noqa: E402
    Agent,
    FunctionTool,
    Handoff,
    Model,
    ModelResponse,
    RunContextWrapper,
    Tool,
)
from agents.run_internal import run_loop as _run_loop  # noqa: E402
from agents.tool import DEFAULT_APPROVAL_REJECTION_MESSAGE  # noqa: E402
from pydantic import TypeAdapter, ValidationError  # noqa: E402
from pydantic_core import to_jsonable_python  # noqa: E402

from ..errors import WorkflowError  # noqa: E402
from ..models import nested_deeper  # noqa: E402
from ._steps import (  # noqa: E402
    ARGUMENT_DEPTH,
    approval,
    in_workflow,
    one_at_a_time,
    refuse,
    scrub,
    scrub_json,
    too_deep,
)
from ._steps import durable as durable_step  # noqa: E402

__all__ = ["SUPPORTED", "DurableModel", "durable", "durable_tool"]

_RESPONSE = TypeAdapter(ModelResponse)


class DurableModel(Model):
    """A :class:`~agents.models.interface.Model` whose every ``get_response``
    inside a workflow is one durable step named ``model:<name>``."""

    def __init__(self, model: Model | str | None, *, name: str) -> None:
        self._model = model
        self.name = name
        self._resolved: Model | None = model if isinstance(model, Model) else None
        self._last: tuple[Model, DurableModel] | None = None
        #: The step policy of each tool's calls, by tool name (``durable(tools=...)``).
        self.tools: dict[str, Mapping[str, Any]] = {}

    def _inner(self) -> Model:
        if self._resolved is None:
            from agents.models.multi_provider import MultiProvider

            self._resolved = MultiProvider().get_model(self._model)  # type: ignore[arg-type]
        return self._resolved

    def for_run(self, run_config: Any) -> DurableModel:
        """This agent's model as a run with ``run_config`` resolves it, durable under
        this model's step name: the SDK lets ``RunConfig(model=...)`` replace every
        agent's model, and its ``model_provider`` resolve an agent's model name."""
        chosen = getattr(run_config, "model", None)
        provider = getattr(run_config, "model_provider", None)
        if isinstance(chosen, DurableModel):
            return chosen
        if isinstance(chosen, str) and provider is not None:
            chosen = provider.get_model(chosen)
        elif not isinstance(chosen, Model):
            if isinstance(self._model, Model) or provider is None:
                return self
            chosen = provider.get_model(self._model)
        if self._last is None or self._last[0] is not chosen:
            # One wrapper per model a run gets: the SDK tells each model it
            # resolved, by identity, when the run ends.
            self._last = (chosen, DurableModel(chosen, name=self.name))
            self._last[1].tools = self.tools
        return self._last[1]

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        """The inner model's response; inside a workflow, asked once and read back."""
        if not in_workflow():
            return await self._inner().get_response(*args, **kwargs)

        async def ask() -> dict[str, Any]:
            return encode_response(await self._inner().get_response(*args, **kwargs))

        return decode_response(await durable_step(f"model:{self.name}", ask))

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        """The inner model's stream; refused inside a workflow (not durable)."""
        if in_workflow():
            refuse(
                WorkflowError(
                    f"model:{self.name}: a streamed run is not durable; use Runner.run or "
                    "Runner.run_sync inside a ninelives workflow"
                )
            )
        return self._inner().stream_response(*args, **kwargs)

    async def _cleanup_on_run_end(self, owner: object) -> None:
        """Tell the inner model its run ended, as the SDK tells the models it resolved."""
        if self._resolved is not None:
            await self._resolved._cleanup_on_run_end(owner)


def _run_model(agent: Any, run_config: Any) -> Model:
    """The SDK's choice of a turn's model, kept durable: an agent made by
    :func:`durable` gets its :class:`DurableModel` resolved for the run (see
    :meth:`DurableModel.for_run`); any other agent the SDK's own choice."""
    own = getattr(agent, "model", None)
    if isinstance(own, DurableModel):
        return own.for_run(run_config)
    return _SDK_MODEL(agent, run_config)


async def _run_tools(agent: Agent[Any], context_wrapper: RunContextWrapper[Any]) -> list[Tool]:
    """The tools the SDK gives a turn, each function tool of an agent made by
    :func:`durable` made durable once: its MCP servers' tools too, which the SDK
    makes function tools at each turn, outside ``agent.tools``."""
    tools = await _SDK_TOOLS(agent, context_wrapper)
    own = getattr(agent, "model", None)
    if not isinstance(own, DurableModel):
        return tools
    return [
        durable_tool(t, own.tools.get(t.name))
        if isinstance(t, FunctionTool) and not hasattr(t.on_invoke_tool, "ninelives_made_from")
        else t
        for t in tools
    ]


# The SDK resolves a turn's model from the agent and the run's RunConfig, which
# no Model sees: a model given per run would bypass the durable one and be asked
# again after every resume. And it lists a turn's tools there, an MCP server's
# among them, which no agent.tools holds. Its run loop is the one place both are
# chosen, so that is where they are made durable.
_SDK_MODEL = getattr(_run_loop.get_model, "sdk_get_model", _run_loop.get_model)
_run_model.sdk_get_model = _SDK_MODEL  # type: ignore[attr-defined]
_run_loop.get_model = _run_model
_SDK_TOOLS = getattr(_run_loop.get_all_tools, "sdk_get_all_tools", _run_loop.get_all_tools)
_run_tools.sdk_get_all_tools = _SDK_TOOLS  # type: ignore[attr-defined]
_run_loop.get_all_tools = _run_tools


def durable_tool(tool: FunctionTool, policy: Mapping[str, Any] | None = None) -> FunctionTool:
    """A copy of ``tool`` whose every call inside a workflow is one durable step
    named ``tool:<name>`` with the step ``policy`` (``@ninelives.step``'s keywords).

    A tool with ``needs_approval`` asks, inside a workflow, a ninelives approval
    step ``approve:<name>`` before its tool step instead of interrupting the run:
    the task waits for ``ninelives approve``; rejected, the model reads the note
    (or the SDK's own rejection message) as the call's output. A tool this made
    already is made again from the tool it was made from (``policy`` the newest)."""
    made_from = getattr(tool.on_invoke_tool, "ninelives_made_from", None)
    if isinstance(made_from, FunctionTool):
        # Wrapped once more, the copy's own needs_approval (False inside a
        # workflow, where its invocation asks) would be read as the tool's:
        # the tool would run unasked. An agent made durable twice, or a handoff
        # target made durable on its own, gets each tool wrapped once.
        tool = made_from
    invoke = tool.on_invoke_tool
    name = f"tool:{tool.name}"
    needs = tool.needs_approval

    async def on_invoke_tool(context: Any, arguments: str) -> Any:
        if not in_workflow():
            return await invoke(context, arguments)
        call_id = str(getattr(context, "tool_call_id", "") or "")

        async def execute(call: str, given: str) -> dict[str, Any]:
            return {"call_id": call, "return": to_jsonable_python(await invoke(context, given))}

        async with one_at_a_time():
            if await _needs_approval(needs, context, arguments, call_id):
                approved, note = approval(tool.name, arguments)
                if not approved:
                    return note or DEFAULT_APPROVAL_REJECTION_MESSAGE
            stored = await durable_step(name, execute, policy, call_id, arguments)
        return answer(name, call_id, stored)

    async def needs_approval(context: Any, params: Any, call_id: str) -> bool:
        # Inside a workflow ninelives asks, as a step, when the tool is invoked.
        return not in_workflow() and await _needs_approval(needs, context, params, call_id)

    on_invoke_tool.ninelives_made_from = tool  # type: ignore[attr-defined]
    if needs is False:
        return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool)
    return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool, needs_approval=needs_approval)


async def _needs_approval(needs: Any, context: Any, arguments: Any, call_id: str) -> bool:
    """The tool's own ``needs_approval`` setting evaluated, as the SDK does it: a
    bool, or a (possibly async) callable of the context, the parsed arguments
    (``{}`` when they are not a JSON object) and the call id."""
    if isinstance(needs, bool) or not callable(needs):
        return bool(needs)
    params = arguments
    if isinstance(arguments, str):
        try:
            params = json.loads(arguments)
        except (ValueError, RecursionError):
            params = {}
    decided = needs(context, params if isinstance(params, dict) else {}, call_id)
    if inspect.isawaitable(decided):
        decided = await decided
    return bool(decided)


def answer(name: str, call_id: str, stored: Any) -> Any:
    """The result a tool step stored for ``call_id``; :class:`~ninelives.errors.WorkflowError`
    when it belongs to another call (exit 12, nothing written). An output a
    person gave (``resolve --done``) is the call's result as given."""
    if not isinstance(stored, dict) or "call_id" not in stored:
        return stored
    if "return" not in stored:
        refuse(
            WorkflowError(f"{name}: the stored result is not a tool result; nothing was written")
        )
    if stored.get("call_id") != call_id:
        refuse(
            WorkflowError(
                f"{name}: the journal holds the result of call {stored.get('call_id')!r} where the "
                f"replay runs call {call_id!r}: the tool calls ran in another order than before; "
                "nothing was written"
            )
        )
    return stored["return"]


def durable(
    agent: Agent[Any],
    *,
    tools: Mapping[str, Mapping[str, Any]] | None = None,
    _seen: dict[int, Agent[Any]] | None = None,
) -> Agent[Any]:
    """A copy of ``agent`` (and of the agents it hands off to) whose model calls
    and function-tool calls are durable steps inside a ninelives workflow.

    ``tools`` maps a tool's name to the step policy of its calls, say
    ``{"post_note": {"on_unknown": "refuse"}}``. The agent given is left as it was.
    """
    seen = {} if _seen is None else _seen
    if id(agent) in seen:
        return seen[id(agent)]
    policies = dict(tools or {})
    model = agent.model if isinstance(agent.model, DurableModel) else None
    if model is None or policies:  # the agent made durable already keeps its own
        spec = agent.model._model if isinstance(agent.model, DurableModel) else agent.model
        made = DurableModel(spec, name=model.name if model else _step_name(agent.name))
        made.tools = {**(model.tools if model else {}), **policies}
        model = made
    wrapped = agent.clone(model=model)
    seen[id(agent)] = wrapped
    wrapped.tools = [
        durable_tool(t, policies.get(t.name)) if isinstance(t, FunctionTool) else t
        for t in agent.tools
    ]
    wrapped.handoffs = [_durable_handoff(h, tools, seen) for h in agent.handoffs]
    return wrapped


def _durable_handoff(
    target: Any, tools: Mapping[str, Mapping[str, Any]] | None, seen: dict[int, Agent[Any]]
) -> Any:
    """A handoff to a durable copy of its agent: an agent given as it is, or a
    ``handoff(agent, ...)`` whose invocation hands over the durable copy."""
    if isinstance(target, Agent):
        return durable(target, tools=tools, _seen=seen)
    if not isinstance(target, Handoff):
        return target
    invoke = target.on_invoke_handoff

    async def on_invoke_handoff(context: Any, arguments: str) -> Any:
        return durable(await invoke(context, arguments), tools=tools, _seen=seen)

    return dataclasses.replace(target, on_invoke_handoff=on_invoke_handoff)


def _step_name(name: str) -> str:
    """An agent's name as step names allow it (letters, digits, ``_.:-``)."""
    import re

    return re.sub(r"[^A-Za-z0-9_.:-]", "_", name)[:100] or "agent"


def encode_response(response: ModelResponse) -> dict[str, Any]:
    """A model response as a step stores it: the SDK's own types as JSON, plus the
    token counts ``ninelives status`` sums. Lone surrogates become U+FFFD, and
    call arguments nesting past :data:`~._steps.ARGUMENT_DEPTH` levels a note
    that is not JSON (that call's error), so a replay reads the same reply back
    and neither the journal nor the SDK chokes on it."""
    usage = response.usage
    stored = scrub(_RESPONSE.dump_python(response, mode="json"))
    for item in stored.get("output") or ():
        arguments = item.get("arguments") if isinstance(item, dict) else None
        if isinstance(arguments, str) and nested_deeper(arguments, ARGUMENT_DEPTH):
            item["arguments"] = too_deep(arguments)
        elif arguments == "" and item.get("type") == "function_call":
            # The SDK runs a call with no arguments as one with `{}`, but cannot
            # read "" for a tool's approval: it would interrupt the run, outside
            # ninelives' approval step. Stored as `{}`, the call asks that step.
            item["arguments"] = "{}"
        elif isinstance(arguments, str):
            item["arguments"] = scrub_json(arguments)
    return {
        "response": stored,
        "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens},
    }


def decode_response(stored: Any) -> ModelResponse:
    """The response a step stored, read back; :class:`~ninelives.errors.WorkflowError`
    (exit 12, one line, nothing written) for one this version cannot read."""
    raw = stored.get("response") if isinstance(stored, dict) else None
    try:
        return _RESPONSE.validate_python(raw)
    except (ValidationError, ValueError, TypeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        refuse(
            WorkflowError(
                f"a stored model response cannot be read back: {first}; nothing was written "
                "(run the task with the framework version that journaled it)"
            )
        )
