"""Steps whose outcome waits for someone: unknown outcomes, probes and approvals.

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
``ninelives resolve`` or ``ninelives approve`` (:mod:`ninelives.runtime.decisions`).

The waits need only a :class:`Waiter`: a store, the tools, the settings and a
progress log, not the whole runtime.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from .. import crashpoints
from ..errors import (
    CommitUnknown,
    OutputRefused,
    TaskBlocked,
    TaskFailed,
    TaskParked,
    TaskWaiting,
)
from ..journal import clean_error, encode_output, error_text, out_of_row
from ..models import Run, Step, StepStatus, Task, TaskStatus
from ..store import REFUSE_REASON

if TYPE_CHECKING:
    from ..settings import Settings
    from ..store import Store
    from ..tools import Registry, Tool

PARKED = (TaskStatus.BLOCKED, TaskStatus.WAITING)


class Waiter(Protocol):
    """What a wait needs of the runner that meets it."""

    @property
    def store(self) -> Store:
        """The store the runner holds its task in."""

    @property
    def tools(self) -> Registry:
        """The tools its steps run with (a probe is one of theirs)."""

    @property
    def settings(self) -> Settings:
        """Its settings (``max_output`` bounds a probe's answer)."""

    def say(self, line: str) -> None:
        """Give ``line`` to the progress log."""


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
        said = f": {prompt}" if isinstance(prompt, str) and prompt else ""  # "" by default
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


def after_claim(rt: Waiter, run: Run, task: Task) -> Task:
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
        settle_probed(rt, run, step, output, block)
    return rt.store.get_task(run.task_id)


def settle_probed(rt: Waiter, run: Run, step: Step, output: str | None, block: str | None) -> None:
    """Commit a probe's answer for ``step``: done with ``output`` (the effect
    happened), pending again (neither), or parked with ``block`` (it could not
    tell), which raises :class:`TaskBlocked`. Run again past the recovery
    limit, the step fails its task instead: :class:`TaskFailed`."""
    if output is not None:
        tag = f"{run.task_id}-{step.idx}"
        output = out_of_row(rt.store.blobs, rt.settings.blob_threshold, output, tag)
    crashpoints.crash("probe_answered", step.idx)
    worn = rt.store.settle_step(
        run, step.idx, output=output, block=block, max_recoveries=rt.settings.max_recoveries
    )
    answer = "happened" if output else "cannot tell" if block else "did not happen"
    rt.say(f"{run.task_id}: step {step.idx} {step.tool} outcome unknown; probe: {answer}")
    if worn is not None:
        raise TaskFailed(f"task {run.task_id!r} failed: {worn}")
    if block is not None:
        raise parked(rt.store.get_task(run.task_id), block)


def _probe(rt: Waiter, run: Run, task: Task, step: Step) -> tuple[str | None, str | None]:
    """Ask the probe: ``(output JSON, None)`` if the effect happened, ``(None, None)``
    if not, ``(None, reason)`` if it cannot tell (it raised, or said nothing storable)."""
    from ..tools import ToolContext

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
    except (Exception, SystemExit) as exc:  # see ninelives.policy.USER_ERRORS
        return None, clean_error(f"the probe could not tell: {error_text(exc)}")
    if answer is None:
        return None, None
    try:
        return encode_output(answer, rt.settings.max_output), None
    except OutputRefused as exc:
        return None, clean_error(f"the probe's answer cannot be stored: {exc}")


def wait_for_approval(rt: Waiter, run: Run, step: Step) -> TaskWaiting:
    """Park an ``approval`` step and its task ``waiting``; the error to raise."""
    prompt = step.input.get("prompt")
    rt.store.park_step(run, step.idx, StepStatus.WAITING, {"prompt": prompt})
    rt.say(f"{run.task_id}: step {step.idx} waits for approval")
    error = parked(rt.store.get_task(run.task_id))
    assert isinstance(error, TaskWaiting)
    return error
