"""The commands by which a person decides a task's course: ``cancel``, ``fork``,
``resolve`` (a step whose outcome was unknown) and ``approve`` (a step waiting
for a person). Standard library only at import.
"""

from __future__ import annotations

import argparse
from typing import Any

from .common import Command, integer, open_runtime, settings_of, stored_or_unknown, task_arg
from .output import confirm, out


def cmd_cancel(args: argparse.Namespace) -> int:
    """``ninelives cancel TASK [--reason TEXT]``."""
    from ..lineage import cancel_allowed, check_reason

    def check(task: Any) -> None:
        check_reason(args.reason)
        cancel_allowed(task)

    with open_runtime(args, create=False, task=args.task_id, check=check) as rt:
        task, changed = rt.cancel(args.task_id, reason=args.reason)
    if changed:
        confirm(f"task {task.id!r} cancelled: it is not run again (a runner holding it stops "
                "before its next step)", f"task {task.id!r} was cancelled")  # fmt: skip
    else:
        out(f"task {task.id!r} was already cancelled")
    return 0


def _cancel_args(p: argparse.ArgumentParser) -> None:
    task_arg(p, "TASK")
    p.add_argument("--reason", metavar="TEXT", help="why, journaled in task_cancelled")


def cmd_fork(args: argparse.Namespace) -> int:
    """``ninelives fork TASK NEW_ID --from STEP [--queue NAME]``."""
    from ..lineage import fork_steps
    from ..names import check_queue, check_task_id

    def check(task: Any) -> None:
        check_task_id(args.new_id)
        if args.queue is not None:
            check_queue(args.queue)
        fork_steps(task, args.start, {})  # the range and the done steps before it

    with (
        open_runtime(args, create=False, task=args.task_id, check=check) as rt,
        stored_or_unknown(args.new_id, "fork"),
    ):
        task = rt.fork(args.task_id, args.new_id, start=args.start, queue=args.queue)
    copied = sum(1 for s in task.steps if s.output is not None)
    where = f" in queue {args.queue!r}" if args.queue else ""
    confirm(
        f"forked task {task.id!r} from {args.task_id!r} at step {args.start}{where}: "
        f"{copied} step(s) copied done, {len(task.steps) - copied} to run",
        f"task {task.id!r} was forked from {args.task_id!r}",
    )
    return 0


def _fork_args(p: argparse.ArgumentParser) -> None:
    task_arg(p, "TASK")
    p.add_argument("new_id", metavar="NEW_ID")
    p.add_argument(
        "--from", dest="start", type=integer, required=True, metavar="STEP",
        help="the first step the fork runs; the steps before it are copied done",
    )  # fmt: skip
    p.add_argument("--queue", metavar="NAME", help="also enqueue the fork for workers of NAME")


def cmd_resolve(args: argparse.Namespace) -> int:
    from ..runtime.decisions import resolve, resolve_decision
    from ..store import decision_target

    settings = settings_of(args)

    def check(task: Any) -> None:
        said = resolve_decision(done=args.done, retry=args.retry, max_output=settings.max_output)
        decision_target(task, args.step, said)

    with open_runtime(args, create=False, task=args.task_id, check=check) as rt:
        task = resolve(
            rt.store, args.task_id, args.step, done=args.done, retry=args.retry,
            max_output=rt.settings.max_output, blob_threshold=rt.settings.blob_threshold,
        )  # fmt: skip
        goes_on = _goes_on(rt.store, task.id, task.status.value)
    what = "done with the output given" if args.done is not None else "pending, to run again"
    confirm(
        f"task {task.id!r} step {args.step} is {what}; the task is {task.status.value}: {goes_on}",
        f"task {task.id!r} step {args.step} was resolved",
    )
    return 0


def _resolve_args(p: argparse.ArgumentParser) -> None:
    task_arg(p)
    p.add_argument("step", type=integer, metavar="STEP", help="the blocked step's index")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--done", metavar="JSON",
        help="its effect happened: this JSON object becomes the step's output",
    )  # fmt: skip
    how.add_argument("--retry", action="store_true", help="it did not happen: run it again")


def cmd_approve(args: argparse.Namespace) -> int:
    from ..models import EventKind, StepStatus
    from ..runtime.decisions import approve, check_note
    from ..store import Decision, decision_target

    def check(task: Any) -> None:
        check_note(args.note)
        said = Decision(StepStatus.WAITING, StepStatus.DONE, EventKind.STEP_APPROVED, data={})
        decision_target(task, args.step, said)

    with open_runtime(args, create=False, task=args.task_id, check=check) as rt:
        task = approve(rt.store, args.task_id, args.step, reject=args.reject, note=args.note)
        failed = task.status.value == "failed"  # nothing runs it next
        goes_on = "" if failed else _goes_on(rt.store, task.id, task.status.value)
    decided = "rejected" if args.reject else "approved"
    if failed:
        line = f"task {task.id!r} step {args.step} rejected: the task has failed"
    elif args.reject:
        line = (
            f"task {task.id!r} step {args.step} rejected; the workflow reads the rejection and "
            f"the task is {task.status.value}: {goes_on}"
        )
    else:
        line = (
            f"task {task.id!r} step {args.step} approved; the task is {task.status.value}: "
            f"{goes_on}"
        )
    confirm(line, f"task {task.id!r} step {args.step} was {decided}")
    return 0


def _goes_on(store: Any, task_id: str, status: str) -> str:
    """Who runs the task next: a worker of its queue claims a queued task by
    itself (a ``run`` beside the workers would only race them for it)."""
    queue = next((t.queue for t in store.tasks_in_status(status) if t.id == task_id), None)
    if queue is not None:
        return f"a worker of queue {queue!r} picks it up"
    return f"'ninelives run {task_id}' resumes it"


def _approve_args(p: argparse.ArgumentParser) -> None:
    task_arg(p)
    p.add_argument("step", type=integer, metavar="STEP", help="the waiting approval step's index")
    p.add_argument("--reject", action="store_true", help="reject: the task fails")
    p.add_argument("--note", metavar="TEXT", help="why (a rejection's note is the task's reason)")


#: The commands of this module, in the order ``--help`` lists them.
COMMANDS = {
    "resolve": Command(
        cmd_resolve,
        "say what happened to a blocked step (its outcome was unknown): --done JSON or --retry",
        _resolve_args, "ninelives resolve pay-7 2 --done '{\"charged\": true}'   # or --retry",
    ),
    "approve": Command(
        cmd_approve,
        "approve (or --reject) a step waiting for a person; the task goes on (or fails)",
        _approve_args, "ninelives approve release-3 1 --note 'checked the diff'   # or --reject",
    ),
    "cancel": Command(
        cmd_cancel, "stop a task for good: a runner holding it stops before its next step",
        _cancel_args, "ninelives cancel nightly-42 --reason 'superseded by nightly-43'",
    ),
    "fork": Command(
        cmd_fork, "a new task from a task's plan, reusing its outputs before a step", _fork_args,
        "ninelives fork demo demo-v2 --from 1   # rerun from step 1 after a fix",
    ),
}  # fmt: skip
