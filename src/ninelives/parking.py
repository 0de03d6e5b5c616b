"""Unknown outcomes and a person in the loop: steps that wait for someone.

A step found ``running`` at recovery has an unknown outcome: its process died
after the ``running`` commit and before the ``done`` one, so its effect may or
may not have happened. Its mode (:attr:`ninelives.tools.Tool.on_unknown`, or
``on_unknown`` in the plan step) decides:

* ``rerun`` (default): it runs again (at least once; the tool is idempotent);
* ``probe``: the claim leaves it ``running``; the runner asks the tool's probe,
  outside any transaction, whether the effect happened (by ``idem_key``) and
  commits the answer: done with the probe's output (``step_reconciled``), run
  again, or, when the probe cannot tell, parked ``blocked``;
* ``refuse`` (at most once): the claim itself parks it ``blocked``.

A built-in ``approval`` step parks its task ``waiting``. Parked tasks are never
claimed; ``run`` stops at once (exit 8) naming the command that moves it on,
``ninelives resolve`` or ``ninelives approve``: :func:`resolve` and :func:`approve`,
each one fenced transaction (:meth:`~ninelives.store.Store.decide_step`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from . import crashpoints
from .errors import (
    CommitUnknown,
    InputError,
    OutputRefused,
    PlanError,
    TaskBlocked,
    TaskParked,
    TaskWaiting,
    ToolError,
)
from .journal import clean_error, encode_output, storable
from .models import APPROVAL_TOOL, EventKind, Run, Step, StepStatus, Task, TaskStatus
from .store import REFUSE_REASON, Decision

if TYPE_CHECKING:
    from .runtime import Runtime
    from .store import Store
    from .tools import Registry, Tool

PARKED = (TaskStatus.BLOCKED, TaskStatus.WAITING)
#: A workflow approval's input key, and its value, for a rejection the code reads.
ON_REJECT = "on_reject"
ANSWER = "answer"


def mode_of(step: Step, tool: Tool) -> str:
    """The effective ``on_unknown`` of a step: the plan's, else its tool's."""
    mode = (step.policy or {}).get("on_unknown")
    return mode if isinstance(mode, str) else tool.on_unknown


def modes(tools: Registry) -> Callable[[Step], str]:
    """``on_unknown(step)`` for :meth:`~ninelives.store.Store.begin_run` and ``claim_next``."""

    def mode(step: Step) -> str:
        mode = (step.policy or {}).get("on_unknown")
        if isinstance(mode, str):  # a workflow's step always says, and has no tool
            return mode
        return mode_of(step, tools.lookup(step.tool))

    return mode


def parked(task: Task, reason: str | None = None) -> TaskParked:
    """The error a parked task raises: one line naming the command that moves it on."""
    step = next((s for s in task.steps if s.status.value == task.status.value), None)
    idx = step.idx if step is not None else "STEP"
    tool = f" ({step.tool})" if step is not None else ""
    if task.status is TaskStatus.WAITING:
        prompt = step.input.get("prompt") if step is not None else None
        said = f": {prompt}" if isinstance(prompt, str) else ""
        return TaskWaiting(
            f"task {task.id!r} is waiting for approval at step {idx}{said}; decide with "
            f"'ninelives approve {task.id} {idx}' or "
            f"'ninelives approve {task.id} {idx} --reject --note TEXT'"
        )
    why = f" ({reason})" if reason else ""
    return TaskBlocked(
        f"task {task.id!r} is blocked: step {idx}{tool} has an unknown outcome{why}; "
        f"say what happened with 'ninelives resolve {task.id} {idx} --done JSON' "
        f"(its output) or 'ninelives resolve {task.id} {idx} --retry' (run it again)"
    )


def refuse_parked(task: Task) -> None:
    """Raise :func:`parked` for a blocked or waiting task: ``run`` writes nothing then."""
    if task.status in PARKED:
        raise parked(task)


def after_claim(rt: Runtime, run: Run, task: Task) -> Task:
    """After the claim: stop at once if it parked the task (``refuse``); ask the
    probe of each step it left running and commit each answer. Returns the task
    as it then stands; raises :class:`TaskBlocked` if a probe could not tell."""
    if task.status in PARKED:
        refused = any(s.status is StepStatus.BLOCKED and s.idx in run.recovered
                      for s in task.steps)  # fmt: skip
        raise parked(task, REFUSE_REASON if refused else None)
    started = run.started[0] if run.started is not None else None
    left = [s for s in task.steps if s.status is StepStatus.RUNNING and s.idx != started]
    if not left:
        return task
    for step in left:
        output, block = _probe(rt, run, task, step)
        crashpoints.crash("probe_answered", step.idx)
        rt.store.settle_step(run, step.idx, output=output, block=block)
        answer = "happened" if output else "cannot tell" if block else "did not happen"
        rt._say(f"{run.task_id}: step {step.idx} {step.tool} outcome unknown; probe: {answer}")
        if block is not None:
            raise parked(rt.store.get_task(run.task_id), block)
    return rt.store.get_task(run.task_id)


def _probe(rt: Runtime, run: Run, task: Task, step: Step) -> tuple[str | None, str | None]:
    """Ask the probe: ``(output JSON, None)`` if the effect happened, ``(None, None)``
    if not, ``(None, reason)`` if it cannot tell (it raised, or said nothing storable)."""
    from .tools import ToolContext

    tool = rt.tools.lookup(step.tool)
    if tool.probe is None:
        return None, f"on_unknown is probe, but tool {step.tool!r} has no probe here"
    rt.store.check_lease(run)  # as before an effect: a runner overtaken asks nothing
    context = ToolContext(
        task_id=run.task_id, step=step.idx, attempt=step.attempts, outputs=task.outputs(),
        idem_key=f"{run.task_id}-{step.idx}",
    )  # fmt: skip
    try:
        answer = tool.ask_probe(step.input, context)
    except CommitUnknown:
        raise
    except Exception as exc:
        return None, clean_error(f"the probe could not tell: {type(exc).__name__}: {exc}")
    if answer is None:
        return None, None
    try:
        return encode_output(answer, rt.settings.max_output), None
    except OutputRefused as exc:
        return None, clean_error(f"the probe's answer cannot be stored: {exc}")


def wait_for_approval(rt: Runtime, run: Run, step: Step) -> TaskWaiting:
    """Park an ``approval`` step and its task ``waiting``; the error to raise."""
    prompt = step.input.get("prompt")
    rt.store.park_step(run, step.idx, StepStatus.WAITING, {"prompt": prompt})
    rt._say(f"{run.task_id}: step {step.idx} waits for approval")
    error = parked(rt.store.get_task(run.task_id))
    assert isinstance(error, TaskWaiting)
    return error


def resolve(
    store: Store,
    task_id: str,
    idx: int,
    *,
    done: str | None = None,
    retry: bool = False,
    max_output: int | None = None,
) -> Task:
    """``ninelives resolve``: a person states the outcome of blocked step ``idx``.

    ``done`` (JSON text of an object, checked like a tool's output) commits the
    step ``done`` with it; ``retry`` puts it back to ``pending`` to run again.
    Either way ``step_resolved`` is journaled and the task becomes ``pending``.
    :class:`InputError` (nothing changed) for bad JSON or a step not blocked.
    """
    from .names import new_run_id

    if (done is None) == (not retry):
        raise InputError("say either --done JSON (what the step output) or --retry")
    if done is not None:
        try:
            value = json.loads(done)
        except (ValueError, RecursionError) as exc:  # too deep for the decoder, too
            raise InputError(f"--done is not JSON: {exc}") from None
        try:
            output = encode_output(value, *(() if max_output is None else (max_output,)))
        except OutputRefused as exc:
            raise InputError(f"--done {exc}") from None
        decision = Decision(
            expect=StepStatus.BLOCKED, status=StepStatus.DONE, kind=EventKind.STEP_RESOLVED,
            data={"outcome": "done"}, output=output,
        )  # fmt: skip
    else:
        decision = Decision(
            expect=StepStatus.BLOCKED, status=StepStatus.PENDING, kind=EventKind.STEP_RESOLVED,
            data={"outcome": "retry"},
        )  # fmt: skip
    return store.decide_step(task_id, new_run_id(), idx, decision)


def approve(
    store: Store, task_id: str, idx: int, *, reject: bool = False, note: str | None = None
) -> Task:
    """``ninelives approve``: a person decides waiting approval step ``idx``.

    Approved: the step is ``done`` with ``{"approved": true, "note": ...}``
    (``step_approved``) and the task ``pending``. Rejected: the step and the task
    fail (``step_rejected``, ``task_failed`` with the note as its reason), unless
    the step is a workflow's ``ctx.approval(..., on_reject="answer")``: then the
    step is ``done`` with ``{"approved": false, "note": ...}`` (``step_rejected``
    with ``outcome: answer``) and the task ``pending``, for the code to read.
    """
    from .names import new_run_id

    if note is not None:
        try:
            storable(note, "--note")
        except ValueError as exc:
            raise InputError(str(exc)) from None
    said: dict[str, Any] = {} if note is None else {"note": note}
    if reject and answers_rejection(store.get_task(task_id), idx):
        decision = Decision(
            expect=StepStatus.WAITING, status=StepStatus.DONE, kind=EventKind.STEP_REJECTED,
            data={**said, "outcome": ANSWER}, output=encode_output({"approved": False, **said}),
        )  # fmt: skip
    elif reject:
        decision = Decision(
            expect=StepStatus.WAITING, status=StepStatus.FAILED, kind=EventKind.STEP_REJECTED,
            data=said, reason=note or f"step {idx} was rejected (no note)",
        )  # fmt: skip
    else:
        decision = Decision(
            expect=StepStatus.WAITING, status=StepStatus.DONE, kind=EventKind.STEP_APPROVED,
            data=said, output=encode_output({"approved": True, **said}),
        )  # fmt: skip
    return store.decide_step(task_id, new_run_id(), idx, decision)


def answers_rejection(task: Task, idx: int) -> bool:
    """True when step ``idx`` is a workflow's approval whose rejection is an answer
    the code reads (``on_reject="answer"``), not the task's failure. A plan's
    ``approval`` step never is: no code after it reads a rejection."""
    step = next((s for s in task.steps if s.idx == idx), None)
    return step is not None and step.tool != APPROVAL_TOOL and step.input.get(ON_REJECT) == ANSWER


def _check_approval(step_input: Mapping[str, Any]) -> None:
    prompt = step_input.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise PlanError("input needs 'prompt', a non-empty string: what the person decides")


def _never_run(step_input: Mapping[str, Any], ctx: Mapping[int, Any], key: str) -> dict[str, Any]:
    raise ToolError("an approval step is decided by 'ninelives approve', never run")


def make_approval() -> Tool:
    """The built-in ``approval`` tool: ``{"prompt": "..."}``; its step waits for a person."""
    from .tools import Tool

    return Tool(
        name=APPROVAL_TOOL, fn=_never_run, validate=_check_approval,
        description="wait for a person to approve (ninelives approve TASK STEP)",
    )  # fmt: skip
