"""Running a workflow task: its function from the top, each step answered by the journal.

:func:`drive` runs a claimed workflow task (see :mod:`ninelives.replay`);
:func:`replay_check` replays one on the code loaded here without running a step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..durable import Workflow, lookup
from ..errors import WorkflowError
from ..models import Run, Task
from ..replay import Released, WorkflowContext, call, task_spec
from .waits import PARKED, parked

if TYPE_CHECKING:
    from .steps import StepRunner


def drive(
    rt: StepRunner,
    run: Run,
    task: Task,
    stop: Callable[[], bool] | None,
    max_wait: float | None,
) -> Task:
    """Run a claimed workflow task's function from the top (see the module's doc)."""
    if task.status in PARKED:
        raise parked(task)
    spec = task_spec(task)
    flow = lookup(spec.name)
    ctx = context_for(flow)(rt, run, task, stop=stop, max_wait=max_wait)
    try:
        ctx.finish(call(flow, ctx, spec))
    except Released:
        pass  # stopped before a step: nothing running, the task as it stands
    return rt.store.get_task(run.task_id)


def context_for(flow: Workflow) -> type[WorkflowContext]:
    """The context class of ``flow``: awaitable steps for an ``async def``."""
    if flow.is_async:
        from ..replay_async import AsyncWorkflowContext

        return AsyncWorkflowContext
    return WorkflowContext


def replay_check(task: Task, max_output: int) -> WorkflowError | None:
    """Replay ``task``'s function on the code loaded here without running any
    step (stored outputs answer): the divergence found, or the error that ends
    every run of this code (it raises on the journal's own values, or returns a
    value ``max_output`` or JSON refuses), or None."""
    spec = task_spec(task)
    flow = lookup(spec.name)
    ctx = context_for(flow)(None, None, task)
    ctx.max_output = max_output
    try:
        ctx.finish(call(flow, ctx, spec))
    except Released:
        pass  # the first step not done: the code reached new work, as a run would
    except WorkflowError as exc:
        # Replay runs no step: the code met nothing but the journal's values,
        # so a run of it would stop with this same error (exit 12).
        return exc
    if isinstance(ctx.dead, WorkflowError):
        return ctx.dead
    return None
