"""The commands on one task's life: ``create``, ``submit``, ``worker``, ``run``,
``retry``, ``status`` and ``export``.

Each handler parses, makes one library call and renders; exit codes are
decided in :mod:`ninelives.cli` alone. Standard library only at import.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..errors import InputError
from ..version import __version__
from . import output
from .common import (
    QUEUE_HELP,
    Command,
    integer,
    number,
    open_reader,
    open_runtime,
    plural,
    queue_of,
    settings_of,
    stored_or_unknown,
    task_arg,
)
from .output import confirm, json_line, on_terminal, out, printable, say


def cmd_create(args: argparse.Namespace) -> int:
    from ..names import check_queue
    from ..runtime import open as open_rt
    from ..runtime import prepare
    from ..tools.builtin import default_registry

    settings = settings_of(args)
    tools = default_registry(settings)  # imports the --tools modules: their workflows too
    # Id, plan and queue are checked before the database is opened: bad input
    # must not leave a new database file behind.
    if args.workflow is not None:
        made = workflow_task(args)
    elif args.plan_file is None or args.args is not None:
        raise InputError(
            f"give a PLAN_FILE, or --workflow NAME [--args JSON] "
            f"(see 'ninelives {args.command} --help')"
        )
    else:
        made = (prepare(args.task_id, args.plan_file, tools), [], {})
    queue = check_queue(queue_of(args)) if args.enqueue or args.queue is not None else None
    with (
        open_rt(args.db, settings=settings, tools=tools) as rt,
        stored_or_unknown(args.task_id, args.command),
    ):
        plan, positional, keywords = made
        task = rt.create(args.task_id, plan, *positional, queue=queue, **keywords)
    if queue is None and args.workflow is None:  # run here, so here is where fetch reads
        _warn_missing_inputs(plan, settings.workspace)
    where = f" in queue {queue!r}" if queue else ""
    what = f"workflow {args.workflow!r}" if args.workflow is not None else None
    what = what or plural(len(task.steps), "step")
    confirm(f"created task {task.id!r} with {what}{where}", f"task {task.id!r} was stored")
    return 0


def _warn_missing_inputs(plan: Any, workspace: str) -> None:
    """One line on stderr naming the ``fetch`` paths that do not exist from
    ``workspace``: a warning only, since the file may be made before ``run``."""
    from ..tools.builtin import missing_fetch_paths

    missing = missing_fetch_paths(plan, workspace)
    if missing:
        named = ", ".join(f"{path} (step {idx})" for idx, path in missing)
        say(
            f"ninelives: warning: fetch reads {named} relative to the folder run runs in "
            f"({os.path.abspath(workspace)}), and it does not exist there yet"
        )


def cmd_submit(args: argparse.Namespace) -> int:
    args.enqueue = True
    return cmd_create(args)


def cmd_worker(args: argparse.Namespace) -> int:
    from ..runtime.worker import Worker, WorkerOptions
    from ..tools.builtin import default_registry

    options = WorkerOptions.from_env(
        args.db, queue=args.queue, concurrency=args.concurrency, lease=args.lease,
        heartbeat=args.heartbeat, poll=args.poll, grace=args.grace, drain=args.drain,
        group_commit=args.group_commit or None, group_linger_ms=args.group_commit_linger_ms,
    )  # fmt: skip
    settings = settings_of(args)
    worker = Worker(
        options, settings=settings, tools=default_registry(settings), log=say,
        step_log=None if args.quiet else say,
        on_progress=None if args.quiet else output.progress_bar(),
    )  # fmt: skip
    return worker.run()


def cmd_run(args: argparse.Namespace) -> int:
    with open_runtime(args, create=False, task=args.task_id) as rt:
        task = rt.run(args.task_id)
    say(f"{task.id}: {task.status.value}")
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    def check(task: Any) -> None:
        from ..agent import regrant
        from ..store import retry_target

        if args.step is not None or regrant(task) is None:  # as the store decides
            retry_target(task, args.step)

    with open_runtime(args, create=False, task=args.task_id, check=check) as rt:
        task = rt.retry(args.task_id, step=args.step)
    confirm(
        f"task {task.id!r} is pending again: 'ninelives run {task.id}' resumes it",
        f"task {task.id!r} is pending again",
    )
    return 0


def _elide(shown: str) -> str:
    return shown if len(shown) <= 72 else shown[:71] + "…"


def _utc(ts: float) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def cmd_status(args: argparse.Namespace) -> int:
    from ..journal import calls_models, model_usage

    as_json = args.json or not on_terminal()
    with open_reader(args) as store:
        task = store.get_task(args.task_id)
        # Only a task that calls models gets the cost keys: the guide's tasks
        # keep exactly the contract's four.
        usage = model_usage(task, store.events(task.id)) if as_json and calls_models(task) else {}
        flow = workflow_view(store, task)
    if as_json:
        view = task.as_status()
        view.update(usage)
        view.update(flow)
        for row, step in zip(view["steps"], task.steps, strict=True):
            # Keys only when set: a task without policies keeps the contract's shape.
            if step.progress is not None:
                row["progress"] = step.progress  # the last ctx.checkpoint
            if step.not_before is not None:
                row["not_before"] = step.not_before  # its backoff: not started before
            if args.outputs:
                row["output"] = step.output
                if step.output_blob is not None:  # stored out of the row (ninelives.blobs)
                    row["output_blob"] = step.output_blob
        out(json_line(view))
        return 0
    goal = f"workflow {flow['workflow']}" if flow else task.goal
    out(printable(f"task {task.id}: {task.status.value}  ({goal})"))
    if "result" in flow:
        out(printable(f"  result: {_elide(json_line(flow['result']))}"))
    for step in task.steps:
        tool = printable(step.tool)
        out(f"  {step.idx:>3}  {tool:<16} {step.status.value:<8} attempts={step.attempts}")
        if step.not_before is not None:
            out(f"         not before {_utc(step.not_before)} (backoff)")
        if step.progress is not None:
            out(printable(f"         progress: {_elide(json_line(step.progress))}"))
        if args.outputs and step.output is not None:
            for key, value in step.output.items():
                out(printable(f"         {key}: {_elide(json_line(value))}"))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from ..store import journal

    with open_reader(args) as store:
        events = journal(store, args.task_id)
        task = store.get_task(args.task_id) if args.format == "otlp-json" else None
    if args.format == "csv":
        from ..traces import csv_lines

        for line in csv_lines(events):
            out(line)
    elif task is not None:
        from ..traces import otlp_request

        out(json_line(otlp_request(task, events, version=__version__)))
    else:
        for event in events:
            out(json_line(event.as_export()))
    return 0


def _export_args(p: argparse.ArgumentParser) -> None:
    task_arg(p)
    p.add_argument(
        "--format",
        choices=("jsonl", "csv", "otlp-json"),
        default="jsonl",
        help="jsonl: one event per line (default); csv: one row per event, its data as "
        "JSON; otlp-json: one OpenTelemetry trace (OTLP/JSON) for Jaeger, Tempo, Honeycomb",
    )


def _workflow_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workflow", metavar="NAME",
        help="a workflow (defined in a --tools module) instead of a PLAN_FILE",
    )  # fmt: skip
    p.add_argument(
        "--args", metavar="JSON",
        help="the workflow's arguments: an array (positional) or object (keyword); default []",
    )  # fmt: skip


def _create_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("task_id", metavar="TASK_ID")
    p.add_argument("plan_file", metavar="PLAN_FILE", nargs="?")
    _workflow_args(p)
    p.add_argument("--enqueue", action="store_true", help="also put it where workers find it")
    p.add_argument("--queue", metavar="NAME", help=QUEUE_HELP + "; implies --enqueue")


def _submit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("task_id", metavar="TASK_ID")
    p.add_argument("plan_file", metavar="PLAN_FILE", nargs="?")
    _workflow_args(p)
    p.add_argument("--queue", metavar="NAME", help=QUEUE_HELP)


def _worker_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--queue", metavar="NAME", help=QUEUE_HELP)
    p.add_argument("--concurrency", type=integer, metavar="N", help="tasks run at once (default 1)")
    p.add_argument(
        "--lease", type=number, metavar="SECONDS",
        help="a claim lapses this long after its last renewal, on the database's clock "
        "(PostgreSQL; default: $NINELIVES_LEASE or 30)",
    )  # fmt: skip
    p.add_argument(
        "--heartbeat", type=number, metavar="SECONDS",
        help="renew held leases this often (default: $NINELIVES_HEARTBEAT or lease/3)",
    )  # fmt: skip
    p.add_argument(
        "--poll", type=number, metavar="SECONDS", help="look for work this often when idle (1)"
    )
    p.add_argument(
        "--grace", type=number, metavar="SECONDS",
        help="on SIGTERM, let running steps finish this long before giving them up (30)",
    )  # fmt: skip
    p.add_argument(
        "--drain",
        action="store_true",
        help="exit 0 once the queue has no unfinished task (11 if some were left because "
        "this worker could not run them)",
    )
    p.add_argument(
        "--group-commit", action="store_true",
        help="SQLite: commit the slots' step transitions together, one fsync per batch "
        "(default: $NINELIVES_GROUP_COMMIT or off)",
    )  # fmt: skip
    p.add_argument(
        "--group-commit-linger-ms", type=number, metavar="MS",
        help="the longest a transition waits for others to join its batch "
        "(default: $NINELIVES_GROUP_COMMIT_LINGER_MS or 2)",
    )  # fmt: skip
    p.add_argument("-q", "--quiet", action="store_true", help="log claims only, not steps")


def _run_args(p: argparse.ArgumentParser) -> None:
    task_arg(p)
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing per step")


def _status_args(p: argparse.ArgumentParser) -> None:
    task_arg(p)
    p.add_argument("--json", action="store_true", help="JSON even on a terminal")
    p.add_argument("--outputs", action="store_true", help="also each done step's output")


def _retry_args(p: argparse.ArgumentParser) -> None:
    task_arg(p)
    p.add_argument(
        "--step", type=integer, metavar="N",
        help="refuse unless step N is the one that failed (a guard for scripts)",
    )  # fmt: skip


def workflow_task(args: argparse.Namespace) -> tuple[Any, list[Any], dict[str, Any]]:
    """``create --workflow NAME --args JSON``: the workflow and its arguments, checked."""
    from ..durable import lookup, parse_arguments, prepare
    from ..errors import InputError

    if args.plan_file is not None:
        raise InputError(
            f"give either a PLAN_FILE or --workflow, not both "
            f"(see 'ninelives {args.command} --help')"
        )
    flow = lookup(args.workflow)
    positional, keywords = parse_arguments(args.args if args.args is not None else "[]")
    prepare(args.task_id, flow, positional, keywords)
    return flow, positional, keywords


def workflow_view(store: Any, task: Any) -> dict[str, Any]:
    """``status --json``'s keys of a workflow task: ``workflow``, ``version``, ``args``,
    ``kwargs`` and, once done, ``result``; nothing for a plan's task."""
    from ..durable import spec_of
    from ..models import TaskStatus

    spec = spec_of(task.goal)
    if spec is None:
        return {}
    view: dict[str, Any] = {
        "workflow": spec.name, "version": spec.version, "args": spec.args, "kwargs": spec.kwargs,
    }  # fmt: skip
    if task.status is TaskStatus.DONE:
        done = [e for e in store.events(task.id) if e.kind == "task_done"]
        view["result"] = done[-1].data.get("result") if done else None
    return view


#: The commands of this module, in the order ``--help`` lists them.
COMMANDS = {
    "create": Command(
        cmd_create, "store a task and its whole plan", _create_args,
        # From the checkout's root: fetch paths are relative to the folder run runs in.
        "cd examples/demo && ninelives create demo plan.json && ninelives run demo",
    ),
    "submit": Command(
        cmd_submit, "store a task and enqueue it for workers (create --enqueue)", _submit_args,
        "ninelives submit nightly-42 plan.json --queue nightly",
    ),
    "worker": Command(
        cmd_worker, "claim queued tasks and run them under a lease until SIGTERM/SIGINT",
        _worker_args,
        "NINELIVES_DB=postgresql://db/ninelives ninelives worker --queue nightly --concurrency 4",
    ),
    "run": Command(
        cmd_run, "recover, then run the task's pending steps until done", _run_args,
        "ninelives run demo          # resumes where the last run stopped",
    ),
    "retry": Command(
        cmd_retry, "move a failed task back to pending, its failed step's attempts reset",
        _retry_args, "ninelives retry demo        # after fixing what made its step fail",
    ),
    "status": Command(
        cmd_status, "show the task and its steps", _status_args,
        "ninelives status demo --json --outputs",
    ),
    "export": Command(
        cmd_export, "print the task's journal (JSON Lines, CSV or an OTLP trace)", _export_args,
        "ninelives export demo --format otlp-json > demo.trace.json",
    ),
}  # fmt: skip
