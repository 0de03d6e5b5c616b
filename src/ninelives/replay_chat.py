"""``ctx.chat`` and ``ctx.call_tool``: model and tool calls as workflow steps.

``ctx.chat(messages, tools=..., system=..., model=..., engine=...)`` is one
durable step named ``chat`` whose body is :func:`ninelives.chat.ask`: a
committed reply is never asked again. ``ctx.call_tool(call)`` is one durable
step named after the tool the call names, whose body is
:func:`ninelives.chat.run_call`: a call with an error (or one that fails the
checks again) runs nothing and returns ``{"error": ...}``, the result the model
reads next; it does not fail the task. The plan agent asks and checks with
the same functions (:mod:`ninelives.agent`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .chat import CHAT_STEP, ask, chat_request, check_offered, run_call
from .errors import PlanError

if TYPE_CHECKING:
    from .models import Step
    from .runtime.steps import StepRunner


def step_name(call: Any) -> str:
    """The name of the step that runs ``call``: its tool's name, or ``call`` for a
    name no step can take (a model may answer anything)."""
    from .durable import NAME_PATTERN
    from .models import AGENT_TOOL, APPROVAL_TOOL

    name = call.get("name") if isinstance(call, Mapping) else None
    valid = isinstance(name, str) and re.fullmatch(NAME_PATTERN, name) is not None
    return name if valid and name not in (AGENT_TOOL, APPROVAL_TOOL) else "call"  # type: ignore[return-value]


def _run_in_step(call: Any, lookup: Callable[[str], Any], awaited: bool) -> Any:
    """:func:`~ninelives.chat.run_call` in the context of the running step."""
    from .durable import current_step

    context = current_step()
    assert context is not None  # a ctx.call_tool step sets it
    return run_call(call, lookup, context, awaited=awaited)


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

    _rt: StepRunner | None
    task_id: str
    _next: int
    _steps: dict[int, Step]

    def _lookup(self) -> Callable[[str], Any]:
        if self._rt is None:  # replay-check runs no step: nothing is looked up
            return lambda name: None
        return self._rt.tools.lookup

    def _chat_step(self, messages: Any, tools: Any, **choices: Any) -> tuple[Any, ...]:
        request = chat_request(messages, tools=tools, **choices)
        lookup = self._lookup()
        if self._rt is not None:
            check_offered(request["tools"], lookup)
            self._check_engine(request)
        return CHAT_STEP, lambda req: ask(req, lookup), request

    def _check_engine(self, request: Mapping[str, Any]) -> None:
        """Refuse (:class:`~ninelives.errors.InputError`, exit 4) a chat step that
        would ask a model engine misconfigured here, before it starts, as a plan's
        model step is refused (:func:`ninelives.llm.check_engine`). A committed
        reply is read back whatever the engine."""
        from .llm import check_engine
        from .models import StepStatus

        idx = self._next
        stored = self._steps.get(idx)
        if stored is None or stored.status is not StepStatus.DONE:
            check_engine(self.task_id, idx, request)

    def _call_step(self, call: Any, awaited: bool = False) -> tuple[Any, ...]:
        lookup = self._lookup()
        fn = _policy(call, lookup, lambda c: _run_in_step(c, lookup, awaited))
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
        """As :meth:`ChatCalls.call_tool`, awaited: an ``async def`` tool runs on
        this workflow's loop."""
        step: Any = self.step  # type: ignore[attr-defined]
        return await step(*self._call_step(call, awaited=True))
