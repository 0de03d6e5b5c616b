"""A claim's recovery, written once against
:class:`~ninelives.store.commits.Transaction`: each step found running after its
process died is run again, parked or left running for its probe (its
``on_unknown`` mode), and a step found running more than ``max_recoveries``
times fails its task, since a step that kills its process every time (out of
memory, a crash) would otherwise be run, or probed, forever.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..models import EventKind, Step, StepStatus, Task
from .rules import (
    PARK_EVENT,
    REFUSE_REASON,
    recover_unknown,
    recovered_by,
    recovery_limit_reason,
)

if TYPE_CHECKING:
    from .commits import Transaction


def recover(
    tx: Transaction,
    task_id: str,
    run_id: str,
    recovered: Sequence[int],
    on_unknown: Callable[[Step], str] | None,
    task: Task | None = None,
    max_recoveries: int | None = None,
) -> tuple[bool, bool]:
    """Inside the claim: each step found running recovered by its mode (``task``
    as the claim read it, else read here only when a mode is asked), then
    ``run_started``; the task failed when a step passes ``max_recoveries``.
    Returns whether a step is left running for its probe, and whether any
    step's row changed (the claim then reads the task again)."""
    rerun, probing = _by_mode(tx, task_id, run_id, recovered, on_unknown, task)
    worn = None
    if max_recoveries is not None:
        worn = _claim_worn_out(tx, task_id, rerun, probing, max_recoveries)
    for idx in rerun:
        tx.event(task_id, run_id, EventKind.STEP_RECOVERED, idx)
    if worn is not None and worn[0] in probing:  # its probe is not asked again
        tx.event(task_id, run_id, EventKind.STEP_RECOVERED, worn[0], {"on_unknown": "probe"})
    tx.event(task_id, run_id, EventKind.RUN_STARTED, None, {"recovered": list(recovered)})
    if worn is None:
        return bool(probing), bool(recovered)
    tx.run("step_failed", {"id": task_id, "idx": worn[0]})
    tx.run("fail_task", {"id": task_id})
    tx.event(task_id, run_id, EventKind.TASK_FAILED, worn[0], {"reason": worn[1]})
    return False, True


def _by_mode(
    tx: Transaction,
    task_id: str,
    run_id: str,
    recovered: Sequence[int],
    on_unknown: Callable[[Step], str] | None,
    task: Task | None,
) -> tuple[list[int], list[int]]:
    """The steps found running, recovered to be run again (``rerun``, whose
    ``step_recovered`` the caller journals) and left running for their probe."""
    if not recovered:
        return [], []
    if on_unknown is None:
        tx.run("recover_steps", {"id": task_id})
        return list(recovered), []
    task = tx.load(task_id) if task is None else task
    rerun, probing = [], []
    for idx, mode in recover_unknown(task, recovered, on_unknown).items():
        if mode == "probe":
            probing.append(idx)  # stays running until the probe's answer is committed
        elif mode == "refuse":
            tx.event(task_id, run_id, EventKind.STEP_RECOVERED, idx, {"on_unknown": mode})
            park(tx, task_id, run_id, idx, StepStatus.BLOCKED, {"reason": REFUSE_REASON})
        else:
            tx.run("recover_step", {"id": task_id, "idx": idx})
            rerun.append(idx)
    return rerun, probing


def _claim_worn_out(
    tx: Transaction, task_id: str, rerun: list[int], probing: list[int], limit: int
) -> tuple[int, str] | None:
    """The first step this claim finds past ``limit``, with the ``task_failed``
    reason. A rerun counts every ``step_recovered``. A probe's recovery is
    journaled when its answer is committed, so a probe whose process died (it
    ran out of memory, it crashed) left none: a probe counts every earlier claim
    that found its step running, else one that kills its process is asked
    forever. It is asked once past the limit: its answer may settle the step."""
    for idx in rerun:
        if (reason := worn_out(tx, task_id, idx, limit)) is not None:
            return idx, reason
    for idx in probing:
        history = tx.rows("recovery_history", {"id": task_id, "idx": idx})
        found = sum(idx in recovered_by(data) for kind, data in history if kind == "run_started")
        earlier = max(found, sum(kind == "step_recovered" for kind, _ in history))
        if earlier > limit:  # counted with this claim in the reason
            return idx, recovery_limit_reason(idx, earlier + 1, limit)
    return None


def park(
    tx: Transaction,
    task_id: str,
    run_id: str,
    idx: int,
    status: StepStatus,
    data: dict[str, Any],
) -> None:
    """Park step ``idx`` and its task as ``status`` (see :meth:`Store.park_step`)."""
    tx.changes_one(
        "park_step",
        {"id": task_id, "idx": idx, "status": status.value},
        f"task {task_id!r} step {idx} is neither pending nor running",
    )
    tx.run("park_task", {"id": task_id, "status": status.value})
    tx.event(task_id, run_id, PARK_EVENT[status], idx, data)


def worn_out(tx: Transaction, task_id: str, idx: int, limit: int | None) -> str | None:
    """The ``task_failed`` reason when recovering step ``idx`` once more passes
    ``limit`` (as a claim counts a rerun's: every ``step_recovered`` so far), else None."""
    if limit is None:
        return None
    row = tx.row("recoveries", {"id": task_id, "idx": idx})
    count = (int(row[0]) if row else 0) + 1
    return recovery_limit_reason(idx, count, limit) if count > limit else None
