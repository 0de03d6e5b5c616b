"""Pydantic AI agents that survive SIGKILL: one capability, no server.

::

    from pydantic_ai import Agent
    from ninelives.integrations.pydantic_ai import NinelivesDurability

    agent = Agent(model, name="notes", capabilities=[NinelivesDurability()])

    @ninelives.workflow("notes")
    def notes(ctx, question):
        return agent.run_sync(question).output     # or `await agent.run(...)` in an async one

Inside a ninelives workflow each model request of the agent is a durable step
named ``model:<agent name>`` and each function-tool call one named
``tool:<tool name>``, in the order the run makes them: the tool calls of one
model response run one at a time, in the response's order, so step k of a
replay is the k-th call again. A committed model response is read back
through Pydantic AI's own message serialization (``ModelMessagesTypeAdapter``)
and never asked again; a committed tool result (stored as JSON, and handed to
the agent as that JSON on the first run as on a replay, so both runs see the
same) is never computed again. A tool function sees
``ninelives.current_step()`` and its ``idem_key`` for an idempotent effect.
``ModelRetry`` raised by a tool is journaled as the step's result (the retry
prompt, as Pydantic AI made it) and raised again on replay, so the model reads
the same prompt; any other exception is a ``step_error``, retried by the step
policy (``tools=``), and fails the task once its attempts are used up.

Approval: a tool declared ``requires_approval=True``, or one that raises
``ApprovalRequired`` (journaled as its step's result, raised again on replay),
does not end the run with ``DeferredToolRequests``: through the capability's
``handle_deferred_tool_calls`` each such call parks the task on a ninelives
approval step ``approve:<tool name>`` (``ctx.approval(..., on_reject="answer")``,
one call at a time in the response's order; ``run`` exits 8).
``ninelives approve TASK STEP`` lets the run go on and the call runs as its
tool step; ``--reject --note TEXT`` hands the model ``ToolDenied(TEXT)`` and
the run goes on. Calls deferred for external execution (``CallDeferred``) are
left to the caller, as without the capability.

Replies: a model response is stored with lone surrogates replaced by U+FFFD
and a tool call's arguments nesting past 29 levels replaced by a note that is
not JSON (the call's error, which the model reads, as in the plan's agent); a
model request that fails fails its step at once (Pydantic AI makes a request
once per run; ``ninelives retry`` asks again).

Outside a workflow, and inside a step of one (an agent run nested in another
agent's tool is part of that tool's step), the capability does nothing: the
agent runs as a plain agent and touches no database. A step cannot wait for a
person, so a nested run's call that needs approval fails that step at once
(``PermanentError``), unless the nested agent declares ``DeferredToolRequests``
among its output types and so takes the requests itself.

Usage is accumulated by Pydantic AI from the responses as usual; each model
step also records ``usage`` so ``ninelives status --json`` counts the model
calls and tokens and the calls a resume saved.

Tested with ``pydantic-ai-slim`` in :data:`SUPPORTED`; importing this module
with another version installed raises
:class:`~ninelives.integrations.FrameworkVersionError`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import require

#: The ``pydantic-ai-slim`` releases this module is tested with: ``>=`` first, ``<`` second.
SUPPORTED = ("2.68", "2.69")
require("pydantic-ai-slim", *SUPPORTED, extra="pydantic-ai")

from pydantic_ai import ModelMessagesTypeAdapter  # noqa: E402
from pydantic_ai.capabilities import AbstractCapability  # noqa: E402
from pydantic_ai.exceptions import (  # noqa: E402
    ApprovalRequired,
    CallDeferred,
    ToolRetryError,
)
from pydantic_ai.messages import ModelRequest, ModelResponse  # noqa: E402
from pydantic_ai.tool_manager import ToolManager  # noqa: E402
from pydantic_ai.tools import DeferredToolResults, ToolDenied  # noqa: E402
from pydantic_core import to_jsonable_python  # noqa: E402

from ..errors import NineLivesError, PermanentError, WorkflowError  # noqa: E402
from ..models import MAX_DEPTH, nested_deeper  # noqa: E402
from ._steps import (  # noqa: E402
    ARGUMENT_DEPTH,
    approval,
    durable,
    in_step,
    in_workflow,
    refuse,
    scrub,
    scrub_json,
    too_deep,
)

__all__ = ["SUPPORTED", "NinelivesDurability"]

_RETRY = "retry"
_RETURN = "return"
_DEFERRED = "deferred"


@dataclass
class NinelivesDurability(AbstractCapability[Any]):
    """Make every model request and function-tool call of the agent a durable
    ninelives step when the agent runs inside a workflow.

    ``name`` names the steps (default: the agent's ``name``, else ``agent``).
    ``tools`` maps a tool's name to the step policy of its calls, as
    ``@ninelives.step`` takes it (``max_attempts``, ``timeout``, ``backoff``,
    ``on_unknown``, ``probe``): say ``{"post_note": {"on_unknown": "refuse"}}``
    for a tool whose effect must not run twice and cannot be checked.
    """

    name: str | None = None
    tools: Mapping[str, Mapping[str, Any]] | None = None

    def for_agent(self, agent: Any) -> AbstractCapability[Any]:
        """Bind the step names to the agent's name (the capability is shared, never mutated)."""
        if self.name is None and getattr(agent, "name", None):
            return NinelivesDurability(name=str(agent.name), tools=self.tools)
        return self

    @property
    def _prefix(self) -> str:
        return self.name or "agent"

    async def wrap_run(self, ctx: Any, *, handler: Callable[[], Awaitable[Any]]) -> Any:
        """Inside a workflow, run the tool calls of each response one at a time, in order."""
        if not in_workflow():
            return await handler()
        with ToolManager.parallel_execution_mode("sequential"):
            return await handler()

    async def wrap_model_request(
        self,
        ctx: Any,
        *,
        request_context: Any,
        handler: Callable[[Any], Awaitable[ModelResponse]],
    ) -> ModelResponse:
        """One durable step per model request: asked once, then read back."""
        if not in_workflow():
            return await handler(request_context)

        asked: list[str] = []

        async def ask() -> dict[str, Any]:
            # Pydantic AI lets a request's handler run once: a second attempt in
            # this process could only fail with its UserError, so the step fails
            # at once, saying why; a later run ('ninelives retry') asks again.
            if asked:
                raise PermanentError(f"the model's reply could not be stored: {asked[0]}")
            asked.append("see the step's error before")
            try:
                response = await handler(request_context)
            except NineLivesError:
                raise
            except Exception as exc:
                raise PermanentError(
                    f"the model request failed: {type(exc).__name__}: {exc} (Pydantic AI makes "
                    "it once per run; 'ninelives retry' asks again)"
                ) from exc
            return encode_response(response)

        stored = await durable(f"model:{self._prefix}", ask)
        return decode_response(stored)

    async def wrap_tool_execute(
        self,
        ctx: Any,
        *,
        call: Any,
        tool_def: Any,
        args: Any,
        handler: Callable[[Any], Awaitable[Any]],
    ) -> Any:
        """One durable step per function-tool call; its JSON result is what the agent gets."""
        if not in_workflow():
            return await handler(args)

        async def execute(call_id: str, given: Any) -> dict[str, Any]:
            try:
                result = await handler(args)
            except ToolRetryError as exc:  # a ModelRetry, as the agent turned it into a part
                return {"call_id": call_id, _RETRY: encode_part(exc.tool_retry)}
            except (ApprovalRequired, CallDeferred) as exc:  # the tool's answer: not yet
                return {"call_id": call_id, _DEFERRED: encode_deferral(exc)}
            return {"call_id": call_id, _RETURN: to_jsonable_python(result)}

        name = f"tool:{call.tool_name}"
        policy = dict((self.tools or {}).get(call.tool_name, {}))
        given = to_jsonable_python(args, fallback=repr)
        stored = await durable(name, execute, policy, call.tool_call_id, given)
        return answer(name, call.tool_call_id, stored)

    async def handle_deferred_tool_calls(self, ctx: Any, *, requests: Any) -> Any:
        """Inside a workflow, each call waiting for approval (``requires_approval=True``,
        or ``ApprovalRequired`` raised by the tool) parks the task on a ninelives
        approval step ``approve:<tool>``, one call at a time in the response's
        order; approved, the call runs as its tool step; rejected, the model reads
        ``ToolDenied`` with the person's note. Calls deferred for external
        execution are left to the caller, as without the capability."""
        outer = in_step()
        if outer is not None and requests.approvals and not takes_deferred(ctx):
            # A step cannot wait for a person: fail it at once, not once per
            # attempt of the outer tool (each of which would run its effects again).
            tools = ", ".join(sorted({call.tool_name for call in requests.approvals}))
            raise PermanentError(
                f"an agent run nested in step {outer} asks for approval of {tools}: a step "
                "cannot wait for a person; give that tool to the workflow's own agent"
            )
        if not in_workflow() or not requests.approvals:
            return None
        results = DeferredToolResults()
        for call in requests.approvals:
            approved, note = approval(call.tool_name, call.args)
            results.approvals[call.tool_call_id] = (
                True if approved else ToolDenied(note) if note else ToolDenied()
            )
        return results


def takes_deferred(ctx: Any) -> bool:
    """Whether the running agent declares ``DeferredToolRequests`` among its output
    types (then a nested run hands its approvals to the code that started it)."""
    from pydantic_ai.tools import DeferredToolRequests

    declared = getattr(getattr(ctx, "agent", None), "output_type", None)
    kinds = declared if isinstance(declared, (list, tuple)) else [declared]
    return any(kind is DeferredToolRequests for kind in kinds)


def encode_deferral(exc: ApprovalRequired | CallDeferred) -> dict[str, Any]:
    """A deferral a tool raised, as JSON."""
    kind = "approval" if isinstance(exc, ApprovalRequired) else exc.kind
    return {"kind": kind, "metadata": to_jsonable_python(exc.metadata, fallback=repr)}


def decode_deferral(stored: Any) -> ApprovalRequired | CallDeferred:
    """The deferral :func:`encode_deferral` stored, to raise again."""
    kind = stored.get("kind") if isinstance(stored, dict) else None
    metadata = stored.get("metadata") if isinstance(stored, dict) else None
    metadata = metadata if isinstance(metadata, dict) else None
    if kind == "approval":
        return ApprovalRequired(metadata)
    if kind in ("external", "question"):
        return CallDeferred(metadata, kind=kind)
    refuse(WorkflowError(f"a stored tool deferral cannot be read back: kind {kind!r}"))


def answer(name: str, call_id: str, stored: Any) -> Any:
    """What a tool step stored for ``call_id``: its result, or its retry prompt
    raised again; :class:`~ninelives.errors.WorkflowError`
    when it belongs to another call (exit 12, nothing written). An output a
    person gave (``resolve --done``) is the call's result as given."""
    if not isinstance(stored, dict) or "call_id" not in stored:
        return stored
    if not ({_RETRY, _RETURN, _DEFERRED} & set(stored)):
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
    if _RETRY in stored:
        raise ToolRetryError(decode_part(stored[_RETRY]))
    if _DEFERRED in stored:
        raise decode_deferral(stored[_DEFERRED])
    return stored[_RETURN]


def encode_part(part: Any) -> Any:
    """A retry prompt part as JSON, through Pydantic AI's message serialization."""
    (message,) = ModelMessagesTypeAdapter.dump_python([ModelRequest(parts=[part])], mode="json")
    return message


def decode_part(stored: Any) -> Any:
    """The retry prompt part :func:`encode_part` stored."""
    from pydantic import ValidationError

    try:
        (message,) = ModelMessagesTypeAdapter.validate_python([stored])
    except (ValidationError, ValueError, TypeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        refuse(WorkflowError(f"a stored tool retry cannot be read back: {first}"))
    if not isinstance(message, ModelRequest) or len(message.parts) != 1:
        refuse(WorkflowError("a stored tool retry cannot be read back: it is not one part"))
    return message.parts[0]


def encode_response(response: ModelResponse) -> dict[str, Any]:
    """A model response as a step stores it: Pydantic AI's own JSON form, plus the
    token counts ``ninelives status`` sums. Lone surrogates become U+FFFD and
    call arguments are fitted (:func:`fit_arguments`), so a replay reads the same
    reply back and the journal can hold it."""
    (message,) = ModelMessagesTypeAdapter.dump_python([response], mode="json")
    message = scrub(message)
    for part in message.get("parts") or ():
        if isinstance(part, dict) and part.get("part_kind") == "tool-call":
            part["args"] = fit_arguments(part.get("args"))
    usage = response.usage
    return {
        "response": message,
        "model": response.model_name or "",
        "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens},
    }


def fit_arguments(args: Any) -> Any:
    """A tool call's arguments as a step can store them: as given while they nest
    little; as their JSON text (which Pydantic AI parses alike) when the reply
    around them would nest past what the journal holds; a note that is not JSON
    (the call's error) past :data:`~._steps.ARGUMENT_DEPTH` levels."""
    if not isinstance(args, (dict, list)):
        text = args if isinstance(args, str) else ""
        return too_deep(text) if nested_deeper(text, ARGUMENT_DEPTH) else scrub_json(text) or args
    text = json.dumps(args, ensure_ascii=False)
    if nested_deeper(text, ARGUMENT_DEPTH):
        return too_deep(text)
    return text if nested_deeper(text, _DICT_DEPTH) else args


#: Levels a reply's stored JSON adds around a call's arguments (``value``,
#: ``response``, ``parts``, the part), and one to spare.
_DICT_DEPTH = MAX_DEPTH - 5


def decode_response(stored: Any) -> ModelResponse:
    """The response a step stored, read back; :class:`~ninelives.errors.WorkflowError`
    (exit 12, one line, nothing written) for one this version cannot read."""
    from pydantic import ValidationError

    message = stored.get("response") if isinstance(stored, dict) else None
    try:
        (response,) = ModelMessagesTypeAdapter.validate_python([message])
    except (ValidationError, ValueError, TypeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        refuse(
            WorkflowError(
                f"a stored model response cannot be read back: {first}; nothing was written "
                "(run the task with the framework version that journaled it)"
            )
        )
    if not isinstance(response, ModelResponse):
        refuse(WorkflowError("a stored model response cannot be read back: it is a request"))
    return response
