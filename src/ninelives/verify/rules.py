"""The rules of step policies, unknown outcomes and approvals, appended steps, cancel and fork.

Each function checks one family of guarantees in a task and its journal and
returns the :class:`~ninelives.verify.Violation` list it found;
:func:`ninelives.verify.check_task` runs them all.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import PlanTampered
from ..journal import CLOSING_KINDS
from ..models import Event, EventKind, StepStatus, Task
from .status import DECIDES, STEP_STATUS_AFTER, status_after
from .violation import Findings, Violation


def policy_violations(task: Task, events: Sequence[Event]) -> list[Violation]:
    """``step_progress`` only inside an attempt, the stored progress equal to the
    last one journaled, and no attempt started before the ``retry_at`` of the
    ``step_error`` before it (a backoff that a restart cut short)."""
    found = Findings(task.id)
    open_steps: set[int] = set()
    journaled: dict[int, Event] = {}
    due: dict[int, tuple[float, int]] = {}
    for event in events:
        idx = event.step_idx
        if idx is None:
            continue
        if event.kind == EventKind.STEP_STARTED.value:
            open_steps.add(idx)
            wait = due.pop(idx, None)
            if wait is not None and event.ts < wait[0]:
                found.add(
                    "backoff",
                    f"step {idx} started {wait[0] - event.ts:.3f}s before the "
                    "retry_at of its step_error",
                    (wait[1], event.seq),
                )
        elif event.kind == EventKind.STEP_PROGRESS.value:
            journaled[idx] = event
            if idx not in open_steps:
                found.add(
                    "progress", f"step {idx} journaled progress while not running", [event.seq]
                )
        elif event.kind in CLOSING_KINDS or event.kind == EventKind.TASK_FAILED.value:
            open_steps.discard(idx)
            retry_at = event.data.get("retry_at")
            if event.kind == EventKind.STEP_ERROR.value and isinstance(retry_at, (int, float)):
                due[idx] = (float(retry_at), event.seq)
        elif event.kind == EventKind.TASK_RETRIED.value:
            due.pop(idx, None)  # a retry is due at once
    for step in task.steps:
        last = journaled.get(step.idx)
        expected = last.data.get("progress") if last is not None else None
        if step.progress != expected:
            found.add(
                "progress",
                f"step {step.idx} holds progress that its journal does not end with",
                [last.seq] if last is not None else [],
            )
    return found


def parking_violations(task: Task, events: Sequence[Event]) -> list[Violation]:
    """Unknown outcomes and approvals: a step is reconciled only right after its
    recovery for a probe, in the same run; a person decides only a step parked
    for that (``step_resolved`` after ``step_blocked``, ``step_approved`` or
    ``step_rejected`` after ``step_waiting``); a rejection fails the task at once
    (unless a workflow's code reads it: ``outcome: answer``);
    a block says why."""
    found = Findings(task.id)
    before: dict[int, Event] = {}
    for i, event in enumerate(events):
        idx = event.step_idx
        if idx is None or event.kind not in STEP_STATUS_AFTER:
            continue
        prior = before.get(idx)
        if event.kind == EventKind.STEP_RECONCILED.value and not (
            prior is not None
            and prior.kind == EventKind.STEP_RECOVERED.value
            and prior.data.get("on_unknown") == "probe"
            and prior.run_id == event.run_id
        ):
            found.add(
                "reconciled",
                f"step {idx} reconciled without a probe's recovery before it",
                [event.seq],
            )
        wanted = DECIDES.get(event.kind)
        if wanted is not None and (prior is None or prior.kind != wanted):
            found.add(
                "decided",
                f"{event.kind} of step {idx} does not follow its {wanted}",
                [event.seq, *([prior.seq] if prior else [])],
            )
        if event.kind == EventKind.STEP_REJECTED.value and status_after(event) is StepStatus.FAILED:
            following = events[i + 1] if i + 1 < len(events) else None
            if following is None or following.kind != EventKind.TASK_FAILED.value:
                found.add(
                    "rejected",
                    f"step {idx} was rejected but the task did not fail with it",
                    [event.seq],
                )
        if event.kind == EventKind.STEP_BLOCKED.value and not event.data.get("reason"):
            found.add("blocked", f"step {idx} was blocked without a reason", [event.seq])
        before[idx] = event
    return found


def past_limits(
    task: Task, events: Sequence[Event], max_attempts: int, max_recoveries: int
) -> list[Violation]:
    """Steps that were run again past a limit instead of failing the task. As the
    runtime counts them: a step's ``step_error`` events since its last
    ``task_retried`` (retry resets its attempts), all its ``step_recovered``
    (see :func:`_run_again_past_recoveries`)."""
    found = Findings(task.id)
    policies = {s.idx: s.policy for s in task.steps if s.policy}
    seqs: dict[int, list[int]] = {}
    for event in events:
        if event.step_idx is None:
            continue
        if event.kind == EventKind.STEP_ERROR.value:
            seqs.setdefault(event.step_idx, []).append(event.seq)
        elif event.kind == EventKind.TASK_RETRIED.value:
            seqs.pop(event.step_idx, None)
    for idx, seen in sorted(seqs.items()):
        limit, name = max_attempts, "AGENT_MAX_ATTEMPTS"
        if "max_attempts" in policies.get(idx, {}):
            limit, name = int(policies[idx]["max_attempts"]), "its max_attempts policy"
        if len(seen) > limit:
            message = (
                f"step {idx} has {len(seen)} step_error events, more than the limit allows "
                f"({name} as verify runs): it was run again instead of failing"
            )
            found.add("attempt_limit", message, seen[limit:])
    for idx, (count, over) in sorted(_run_again_past_recoveries(events, max_recoveries).items()):
        message = (
            f"step {idx} has {count} step_recovered events, more than the limit allows "
            "(NINELIVES_MAX_RECOVERIES as verify runs): it was run again instead of failing"
        )
        found.add("recovery_limit", message, over)
    return found


def _run_again_past_recoveries(
    events: Sequence[Event], limit: int
) -> dict[int, tuple[int, list[int]]]:
    """Per step: all its ``step_recovered`` (the runtime never resets the count)
    and those past ``limit`` after which the step was started again. The runtime
    fails the task at such a recovery (or parks the step for a person); only a
    person's ``retry`` or ``resolve --retry`` may run it again after that."""
    counts: dict[int, int] = {}
    past: dict[int, int] = {}
    found: dict[int, list[int]] = {}
    for event in events:
        idx = event.step_idx
        if idx is None:
            continue
        if event.kind == EventKind.STEP_RECOVERED.value:
            counts[idx] = counts.get(idx, 0) + 1
            if counts[idx] > limit:
                past[idx] = event.seq
        elif event.kind in (EventKind.TASK_RETRIED.value, EventKind.STEP_RESOLVED.value):
            past.pop(idx, None)
        elif event.kind == EventKind.STEP_STARTED.value and idx in past:
            found.setdefault(idx, []).append(past.pop(idx))
    return {idx: (counts[idx], over) for idx, over in found.items()}


def appended_violations(task: Task, events: Sequence[Event]) -> list[Violation]:
    """Steps past the plan's count each have one ``step_appended``; planned ones none."""
    created = next((e for e in events if e.kind == EventKind.TASK_CREATED.value), None)
    planned = created.data.get("steps") if created is not None else None
    if not isinstance(planned, int):
        return []
    appended: dict[int, list[int]] = {}
    for event in events:
        if event.kind == EventKind.STEP_APPENDED.value and event.step_idx is not None:
            appended.setdefault(event.step_idx, []).append(event.seq)
    found = Findings(task.id)
    for step in task.steps:
        seqs = appended.get(step.idx, [])
        expected = 1 if step.idx >= planned else 0
        if len(seqs) != expected:
            what = "appended" if step.idx >= planned else "planned"
            found.add(
                "appended",
                f"{what} step {step.idx} has {len(seqs)} step_appended events, expected {expected}",
                seqs,
            )
    return found


def forked_steps(events: Sequence[Event]) -> frozenset[int]:
    """The steps a fork copied done (those before its ``task_forked``'s ``from``)."""
    for event in events:
        if event.kind == EventKind.TASK_FORKED.value:
            start = event.data.get("from")
            return frozenset(range(start)) if isinstance(start, int) else frozenset()
    return frozenset()


def lineage_violations(task: Task, events: Sequence[Event]) -> list[Violation]:
    """The invariants of cancel, fork and the plan's SHA-256.

    ``plan_integrity``: the stored goal and steps hash to the digest kept since
    create. ``cancel``: at most one ``task_cancelled``, none after the task was
    done, and after it no ``step_started``, ``task_done`` or ``task_failed``
    (a cancelled task starts no step). ``fork``: at most one ``task_forked``,
    right after ``task_created``; each step it copied is done with an output
    and was never started in this task.
    """
    from ..lineage import check_plan

    found = Findings(task.id)
    try:
        check_plan(task)
    except PlanTampered as exc:
        found.add("plan_integrity", str(exc))
    found.extend(cancel_violations(task, events))
    found.extend(fork_violations(task, events))
    return found


def cancel_violations(task: Task, events: Sequence[Event]) -> Findings:
    """At most one ``task_cancelled``, none after ``task_done``, and nothing
    started or ended after it."""
    found = Findings(task.id)
    cancels = [e.seq for e in events if e.kind == EventKind.TASK_CANCELLED.value]
    if len(cancels) > 1:
        found.add("cancel", f"{len(cancels)} task_cancelled events", cancels)
    if cancels:
        done = [e.seq for e in events if e.kind == EventKind.TASK_DONE.value and e.seq < cancels[0]]
        if done:
            found.add("cancel", "task_cancelled after task_done", [*done, cancels[0]])
        after = [
            e.seq
            for e in events
            if e.seq > cancels[0]
            and e.kind
            in (
                EventKind.STEP_STARTED.value,
                EventKind.TASK_DONE.value,
                EventKind.TASK_FAILED.value,
            )
        ]
        if after:
            found.add(
                "cancel",
                f"{len(after)} step_started/task_done/task_failed after task_cancelled",
                [cancels[0], *after],
            )
    return found


def fork_violations(task: Task, events: Sequence[Event]) -> Findings:
    """At most one ``task_forked``, right after ``task_created``; each step it
    copied is done with an output and never started in this task."""
    found = Findings(task.id)
    forks = [e for e in events if e.kind == EventKind.TASK_FORKED.value]
    if len(forks) > 1 or (forks and (len(events) < 2 or events[1] is not forks[0])):
        found.add(
            "fork",
            "task_forked must be the one event right after task_created",
            [e.seq for e in forks],
        )
    copied = forked_steps(events)
    if copied:
        by_idx = {s.idx: s for s in task.steps}
        for idx in sorted(copied):
            step = by_idx.get(idx)
            if step is None or step.output is None:
                found.add(
                    "fork", f"step {idx} was copied by the fork but has no output", [forks[0].seq]
                )
        started = [
            e.seq for e in events if e.kind == EventKind.STEP_STARTED.value and e.step_idx in copied
        ]
        if started:
            found.add("fork", "a step the fork copied done was started again", started)
    return found
