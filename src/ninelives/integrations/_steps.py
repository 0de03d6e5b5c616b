"""The one seam between a framework's async hooks and a workflow's steps.

A framework calls its model and its tools from coroutines, also when the
workflow is a plain ``def`` that calls ``agent.run_sync(...)``: that runs an
event loop in the workflow's own thread. :func:`durable` makes one awaited
durable step there, on a sync workflow's context as on an async one's, with
the same two commits, crash points, attempts and recovery as ``ctx.step``.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NoReturn

from ..durable import ACTIVE, CURRENT
from ..models import MAX_DEPTH

#: Tool-call arguments nesting deeper than this are that call's error, as in
#: the plan's agent (``ninelives.agent.MAX_ARGUMENT_DEPTH``).
ARGUMENT_DEPTH = MAX_DEPTH - 3


def in_step() -> int | None:
    """The index of the running workflow's step this code runs inside (an agent
    run nested in another agent's tool), else None."""
    step = CURRENT.get()
    return step.step if ACTIVE.get() is not None and step is not None else None


def in_workflow() -> bool:
    """True inside a running workflow and outside any of its steps: where a model
    request or a tool call should be a durable step of its own."""
    return ACTIVE.get() is not None and CURRENT.get() is None


async def durable(
    name: str,
    fn: Callable[..., Awaitable[Any]],
    policy: Mapping[str, Any] | None = None,
    *args: Any,
) -> Any:
    """Await ``fn(*args)`` as the running workflow's next step ``name`` with the
    step ``policy`` (``@ninelives.step``'s keywords); its value, from the journal
    when the step is done already."""
    from ..durable import step
    from ..replay import caller, value_of
    from ..replay_async import AsyncWorkflowContext

    ctx = ACTIVE.get()
    target: Any = step(name, **dict(policy))(fn) if policy else fn
    # The guard keeps what ends the run (a cancel, a lost lease) on the context:
    # a framework that wraps the error in its own still ends the run with it.
    with ctx.guard():
        found, attempt = ctx.enter_step(name, target, args, {})
        if attempt is None:
            return value_of(found.output)
        rules = dict(target.policy) if policy else {}
        # The async attempt loop, on whichever context runs: it only awaits `fn`
        # between the commits the sync context makes.
        # A framework runs a sync tool (or model function) in a thread, which a
        # timeout cannot stop: one that overruns ends the process (exit 5).
        return await AsyncWorkflowContext.attempts_async(
            ctx, found, attempt, caller(target, args, {}), rules, threaded=True
        )


_LOCKS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def one_at_a_time() -> Any:
    """An async context manager that lets one tool step of the running workflow
    run at a time, in the order the calls reach it (an ``asyncio.Lock`` is fair):
    a framework that starts a response's tool calls concurrently still makes
    their steps one after another."""
    import asyncio

    # One lock per event loop: an asyncio.Lock binds to the first loop it waits
    # on, and a sync workflow may run its agents on several loops one after
    # another (`asyncio.run(Runner.run(...))` twice); they never overlap.
    ctx = ACTIVE.get()
    loop = asyncio.get_running_loop()
    held = _LOCKS.get(ctx)
    if held is None or held[0] is not loop:
        held = _LOCKS[ctx] = (loop, asyncio.Lock())
    return held[1]


def approval(tool: str, args: Any) -> tuple[bool, str | None]:
    """Ask a person, as the running workflow's next step ``approve:<tool>``, whether
    the model's call of ``tool`` with ``args`` may run: ``(approved, note)``.

    The first time, the step parks the task ``waiting``
    (:class:`~ninelives.errors.TaskWaiting`, ``run`` exits 8) until
    ``ninelives approve TASK STEP [--reject] [--note TEXT]``; once decided, the
    decision is read back from the journal. A rejection is an answer the agent
    gives the model (``on_reject="answer"``), not the task's failure."""
    from ..replay import WorkflowContext

    ctx = ACTIVE.get()
    said = WorkflowContext.approval(ctx, f"approve:{tool}", _prompt(tool, args), on_reject="answer")
    note = said.get("note") if isinstance(said, dict) else None
    approved = isinstance(said, dict) and said.get("approved") is True
    return approved, note if isinstance(note, str) and note else None


#: How much of a call's arguments the approval prompt shows.
PROMPT_ARGS = 400


def _prompt(tool: str, args: Any) -> str:
    """The approval's prompt: the tool and its arguments, cut short, as text any
    store holds (a lone surrogate or a control character is escaped)."""
    import json

    if not isinstance(args, str):
        try:
            args = json.dumps(args, ensure_ascii=True, sort_keys=True, default=repr)
        except (ValueError, TypeError, RecursionError):
            args = "(arguments not shown)"
    if len(args) > PROMPT_ARGS:
        args = args[:PROMPT_ARGS] + f"... ({len(args)} characters)"
    shown = args.encode("ascii", "backslashreplace").decode("ascii")
    return f"run tool {tool} with {shown}"


def too_deep(text: str) -> str:
    """What a model reply stores instead of call arguments (JSON ``text``) that
    nest past :data:`ARGUMENT_DEPTH`: a note that is not JSON, so the framework's
    own bad-arguments path makes it the call's error, read by the model; never a
    reply the journal cannot hold or the framework cannot parse on replay."""
    return (
        f"(arguments of {len(text)} characters that nest more than {ARGUMENT_DEPTH} "
        "levels deep: not run)"
    )


def scrub(value: Any) -> Any:
    """``value`` (JSON-able) with each lone surrogate of its strings replaced by
    U+FFFD: a model may send one (``"\\ud800"``), and neither the journal nor
    the frameworks' own bookkeeping can encode it as UTF-8."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return value
    if isinstance(value, list):
        return [scrub(v) for v in value]
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    return value


def scrub_json(text: str) -> str:
    """JSON ``text`` (a call's arguments) with its escaped lone surrogates
    (``\\ud800``) replaced as :func:`scrub` does; as given when it has none or
    does not parse (then it is the call's error anyway)."""
    import json
    import re

    if not re.search(r"\\u[dD][89a-fA-F]", text):
        return text
    try:
        return json.dumps(scrub(json.loads(text)), ensure_ascii=False)
    except (ValueError, RecursionError):
        return text


def refuse(error: BaseException) -> NoReturn:
    """End the running workflow's run with ``error`` (a
    :class:`~ninelives.errors.WorkflowError`): kept on its context, so a
    workflow that catches it is refused all the same, as for a divergence."""
    ctx = ACTIVE.get()
    if ctx is not None:
        ctx.dead = error
    raise error
