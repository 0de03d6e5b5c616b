"""The commands that check tasks after the fact: ``verify``, ``torture`` and
``replay-check``. Each raises :class:`~ninelives.errors.VerificationFailed`
(exit 7) on what it finds, after printing it. Standard library only at import.
"""

from __future__ import annotations

import argparse
import os

from ..errors import (
    DamagedTask,
    InputError,
    PlanError,
    StoreError,
    VerificationFailed,
    WorkflowDiverged,
)
from .common import Command, integer, number, open_reader, settings_of, stored_id
from .output import findings, flush, out, printable, say, scrub


def _one_target(args: argparse.Namespace, command: str) -> None:
    """A TASK or ``--all``: neither, or both, is bad input that says which."""
    if (args.task_id is None) != args.all:
        which = ", not both" if args.all else ""
        raise InputError(f"give a TASK or --all{which} (see 'ninelives {command} --help')")


def cmd_verify(args: argparse.Namespace) -> int:
    from ..settings import Settings
    from ..store import MissingStore
    from ..verify import verify_store

    settings = Settings.from_env()
    _one_target(args, "verify")
    if args.artifacts == "":  # a script's unset variable: never the working directory
        raise InputError("--artifacts is empty: name the folder the tasks publish to")
    if args.artifacts is not None and os.path.exists(args.artifacts):
        if not os.path.isdir(args.artifacts):
            raise InputError(f"--artifacts {args.artifacts}: not a folder")
    with open_reader(args) as store:
        if args.all and isinstance(store, MissingStore):
            raise StoreError(f"no database at {args.db} ('ninelives create' makes one)")
        ids = None if args.all else [args.task_id]
        limits = (settings.max_attempts, settings.max_recoveries)
        report = verify_store(store, ids, artifacts=args.artifacts, limits=limits)
    integrity = ", integrity checked" if report.integrity_checked else ""
    summary = f"verified {report.tasks} task(s), {report.events} event(s){integrity}"
    with findings():
        for violation in report.violations:
            out(printable(scrub(str(violation))))
        count = f"{len(report.violations)} violation(s)" if report.violations else "no violations"
        out(f"{summary}: {count}")
        flush()  # the list is the finding: a failure to print it is not "violations"
    if report.ok:
        return 0
    tampered = sorted({v.task_id for v in report.violations if v.check == "plan_integrity"})
    if tampered:  # refused as run refuses it: exit 5, naming the task
        from ..errors import PlanTampered

        named = ", ".join(repr(t) for t in tampered)
        raise PlanTampered(
            f"task {named}: stored goal or steps changed since create (SHA-256 mismatch)",
            task_id=tampered[0],
        )
    raise VerificationFailed(f"{len(report.violations)} violation(s) found")


def cmd_torture(args: argparse.Namespace) -> int:
    from ..torture import torture

    if args.tools is not None:
        # The plan is checked here and run by child processes: both read the variable.
        os.environ["NINELIVES_TOOLS"] = args.tools
    report = torture(
        args.plan,
        workflow=args.workflow,
        args=args.args,
        kills=args.kills,
        seed=args.seed,
        workers=args.workers,
        folder=args.dir,
        pause=args.pause,
        log=None if args.quiet else say,
    )
    with findings():
        for line in report.summary_lines():
            out(printable(line))
        flush()
    if not report.ok:
        raise VerificationFailed(
            f"{report.duplicates} duplicate(s), {report.lost_commits} lost commit(s), "
            f"{len(report.violations)} violation(s); replay with --seed {report.seed}"
        )
    return 0


def _verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("task_id", metavar="TASK", nargs="?", type=stored_id)
    p.add_argument("--all", action="store_true", help="check every task")
    p.add_argument("--artifacts", metavar="DIR", help="also check the published files in DIR")


def _torture_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", metavar="PLAN", nargs="?", help="a plan file (or give --workflow)")
    p.add_argument("--workflow", metavar="NAME", help="torture tasks of this workflow instead")
    p.add_argument("--args", metavar="JSON", help="the workflow's arguments (default [])")
    p.add_argument("--kills", type=integer, default=10, metavar="N", help="SIGKILLs (default 10)")
    p.add_argument("--seed", type=integer, metavar="S", help="seed of the kill schedule")
    p.add_argument("--workers", type=integer, default=1, metavar="K", help="tasks run in parallel")
    p.add_argument("--dir", metavar="DIR", help="scratch folder (default: a new temp folder)")
    p.add_argument(
        "--pause",
        type=number,
        default=0.01,
        metavar="SECONDS",
        help="sleep at every crash point so kills land between commits (default 0.01; 0: off)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")


def cmd_replay_check(args: argparse.Namespace) -> int:
    """``ninelives replay-check (TASK | --all)``: replay each unfinished workflow task
    on the code loaded here, running no step; exit 7 with one line per divergence."""
    from ..models import TaskStatus, is_workflow
    from ..runtime.workflows import replay_check
    from ..tools.builtin import default_registry

    _one_target(args, "replay-check")
    settings = settings_of(args)
    default_registry(settings)  # imports the --tools modules: their workflows
    finished = (TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.CANCELLED)
    found: list[str] = []
    checked = 0
    with open_reader(args) as store:
        ids = store.task_ids() if args.all else [args.task_id]
        for task_id in ids:
            task = None
            try:
                task = store.get_task(task_id)
                if not is_workflow(task.goal):
                    if args.all:
                        continue
                    raise InputError(f"task {task_id!r} is not a workflow task: nothing to replay")
                if args.all and task.status in finished:
                    continue
                checked += 1
                diverged = replay_check(task, settings.max_output)
            except (DamagedTask, PlanError) as exc:
                if not args.all:
                    raise
                # One task that cannot be replayed here (its rows damaged, its
                # workflow not in the loaded modules) hides none of the others.
                checked += task is None  # else counted already
                found.append(f"{task_id}: cannot be replayed here: {exc}")
                continue
            if diverged is not None and not isinstance(diverged, WorkflowDiverged):
                found.append(f"{task_id}: cannot be replayed here: {diverged}")
            elif diverged is not None:
                called = diverged.called if diverged.called is not None else "(returns)"
                held, calls = (f"{k} " for k in diverged.kinds) if diverged.kinds else ("", "")
                found.append(
                    f"{diverged.task_id}: step {diverged.step}: journal {held}"
                    f"{diverged.stored!r}, code {calls}{called!r}"
                )
    with findings():
        for line in found:
            out(printable(line))
        flush()
    if found:
        raise VerificationFailed(
            f"{len(found)} of {checked} workflow task(s) diverge or cannot be replayed here"
        )
    out(f"replay-check: {checked} workflow task(s) replay on this code")
    return 0


def _replay_check_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("task_id", metavar="TASK", nargs="?", type=stored_id)
    p.add_argument("--all", action="store_true", help="every unfinished workflow task")


#: The commands of this module, in the order ``--help`` lists them.
COMMANDS = {
    "verify": Command(
        cmd_verify, "check tasks after the fact: journal, statuses, outputs, artifacts",
        _verify_args, "ninelives verify --all --artifacts artifacts",
    ),
    "torture": Command(
        cmd_torture, "SIGKILL fresh tasks of a plan at random, resume them, verify", _torture_args,
        "cd examples/demo && ninelives torture plan.json --kills 20 --seed 7",
    ),
    "replay-check": Command(
        cmd_replay_check,
        "replay unfinished workflow tasks on this code, running no step: report any divergence",
        _replay_check_args, "ninelives --tools flows replay-check --all   # before a deploy",
    ),
}  # fmt: skip
