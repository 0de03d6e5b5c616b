"""The ``ninelives`` command: argparse over the library API.

Each handler parses, makes one library call and renders. Exit codes are
decided here, in :data:`EXIT_CODES`, and nowhere else. Only the standard
library is imported on this path; backends and tools load when used.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from . import __version__
from .errors import (
    CommitUnknown,
    InputError,
    NineLivesError,
    StoreError,
    TaskBusy,
    TaskFailed,
    UnknownTask,
    VerificationFailed,
)

#: Exit code per error branch; the first matching class wins (subclasses first).
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (UnknownTask, 1),
    (TaskFailed, 2),
    (TaskBusy, 3),
    (InputError, 4),
    (CommitUnknown, 6),
    (StoreError, 5),
    (VerificationFailed, 7),
    (NineLivesError, 5),
)
EXIT_INTERRUPTED = 130

EPILOG = """exit codes:
  0  done (also when already done)     4  bad input (usage, plan, task id, existing id)
  1  unknown task                      5  database unusable (missing folder, corrupt, not SQLite)
  2  task failed (attempt limit)       6  an I/O error left a write's outcome unknown; run again
  3  another process runs this task    7  verify or torture found violations (listed on stdout)
                                     130  interrupted
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, and the bad-input code instead of argparse's 2 (which the
        # contract gives to "task failed").
        raise InputError(f"{message} (see '{self.prog} --help')")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    # argparse builds a formatter for every add_argument, and without a width
    # each one imports shutil (with bz2 and lzma) to read the terminal size:
    # ~3 ms of every start-up. The terminal size comes from os instead.
    def __init__(self, prog: str, **kwargs: Any) -> None:
        if kwargs.get("width") is None:
            kwargs["width"] = _terminal_width()
        super().__init__(prog, **kwargs)


@functools.cache
def _terminal_width() -> int:
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 80
    return max(columns - 2, 20)


def _runtime(args: argparse.Namespace, *, create: bool = True) -> Any:
    from .runtime import open as open_runtime

    log = None if getattr(args, "quiet", False) else _stderr
    return open_runtime(args.db, create=create, log=log)


def _stderr(line: str) -> None:
    # Progress lines are best effort: a stderr that fails (EIO, a full disk
    # under a log file) must not stop a runner whose state is committed.
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


def cmd_create(args: argparse.Namespace) -> int:
    from .runtime import check_queue, prepare
    from .runtime import open as open_runtime
    from .settings import Settings
    from .tools.builtin import default_registry

    settings = Settings.from_env()
    tools = default_registry(settings)
    # Id, plan and queue are checked before the database is opened: bad input
    # must not leave a new database file behind.
    plan = prepare(args.task_id, args.plan_file, tools)
    queue = check_queue(_queue(args)) if args.enqueue or args.queue is not None else None
    with open_runtime(args.db, settings=settings, tools=tools) as rt:
        task = rt.create(args.task_id, plan, queue=queue)
    where = f" in queue {queue!r}" if queue else ""
    print(f"created task {task.id!r} with {len(task.steps)} steps{where}")
    return 0


def _queue(args: argparse.Namespace) -> str:
    if args.queue is not None:  # given, even empty: checked as given
        return str(args.queue)
    return os.environ.get("NINELIVES_QUEUE") or "default"


def cmd_submit(args: argparse.Namespace) -> int:
    args.enqueue = True
    return cmd_create(args)


def cmd_worker(args: argparse.Namespace) -> int:
    from .worker import Worker, WorkerOptions

    options = WorkerOptions.from_env(
        args.db, queue=args.queue, concurrency=args.concurrency, lease=args.lease,
        heartbeat=args.heartbeat, poll=args.poll, grace=args.grace, drain=args.drain,
    )  # fmt: skip
    return Worker(options, log=_stderr, step_log=None if args.quiet else _stderr).run()


def cmd_run(args: argparse.Namespace) -> int:
    with _runtime(args, create=False) as rt:
        task = rt.run(args.task_id)
    _stderr(f"{task.id}: {task.status.value}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from .journal import calls_models, model_usage

    as_json = args.json or args.outputs or not sys.stdout.isatty()
    with _runtime(args, create=False) as rt:
        task = rt.status(args.task_id)
        # Only a task that calls models gets the cost keys: the guide's tasks
        # keep exactly the contract's four.
        usage = (
            model_usage(task, rt.store.events(task.id)) if as_json and calls_models(task) else {}
        )
    if as_json:
        view = task.as_status()
        view.update(usage)
        if args.outputs:
            for row, step in zip(view["steps"], task.steps, strict=True):
                row["output"] = step.output
        print(json.dumps(view, ensure_ascii=False))
        return 0
    print(f"task {task.id}: {task.status.value}  ({task.goal})")
    for step in task.steps:
        print(f"  {step.idx:>3}  {step.tool:<16} {step.status.value:<8} attempts={step.attempts}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    with _runtime(args, create=False) as rt:
        events = rt.export(args.task_id)
    out = sys.stdout
    for event in events:
        out.write(json.dumps(event.as_export(), ensure_ascii=False) + "\n")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from .store import MissingStore, open_store
    from .verify import verify_store

    if (args.task_id is None) != args.all:
        raise InputError("give a TASK or --all, not both (see 'ninelives verify --help')")
    if args.artifacts is not None and os.path.exists(args.artifacts):
        if not os.path.isdir(args.artifacts):
            raise InputError(f"--artifacts {args.artifacts}: not a folder")
    store = open_store(args.db, create=False)
    try:
        if args.all and isinstance(store, MissingStore):
            raise StoreError(f"no database at {args.db}")
        ids = None if args.all else [args.task_id]
        report = verify_store(store, ids, artifacts=args.artifacts)
    finally:
        store.close()
    for violation in report.violations:
        print(violation)
    integrity = ", integrity checked" if report.integrity_checked else ""
    summary = f"verified {report.tasks} task(s), {report.events} event(s){integrity}"
    if report.ok:
        print(f"{summary}: no violations")
        return 0
    print(f"{summary}: {len(report.violations)} violation(s)")
    raise VerificationFailed(f"{len(report.violations)} violation(s) found")


def cmd_torture(args: argparse.Namespace) -> int:
    from .torture import torture

    report = torture(
        args.plan,
        kills=args.kills,
        seed=args.seed,
        workers=args.workers,
        folder=args.dir,
        pause=args.pause,
        log=None if args.quiet else _stderr,
    )
    for line in report.summary_lines():
        print(line)
    if not report.ok:
        raise VerificationFailed(
            f"{report.duplicates} duplicate(s), {report.lost_commits} lost commit(s), "
            f"{len(report.violations)} violation(s); replay with --seed {report.seed}"
        )
    return 0


Handler = Callable[[argparse.Namespace], int]
QUEUE_HELP = "the workers' queue (default: $NINELIVES_QUEUE or 'default')"


def _task_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("task_id", metavar="TASK_ID")


def _create_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("task_id", metavar="TASK_ID")
    p.add_argument("plan_file", metavar="PLAN_FILE")
    p.add_argument("--enqueue", action="store_true", help="also put it where workers find it")
    p.add_argument("--queue", metavar="NAME", help=QUEUE_HELP + "; implies --enqueue")


def _submit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("task_id", metavar="TASK_ID")
    p.add_argument("plan_file", metavar="PLAN_FILE")
    p.add_argument("--queue", metavar="NAME", help=QUEUE_HELP)


def _worker_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--queue", metavar="NAME", help=QUEUE_HELP)
    p.add_argument("--concurrency", type=int, metavar="N", help="tasks run at once (default 1)")
    p.add_argument(
        "--lease", type=float, metavar="SECONDS",
        help="a claim lapses this long after its last renewal, on the database's clock "
        "(PostgreSQL; default: $NINELIVES_LEASE or 30)",
    )  # fmt: skip
    p.add_argument(
        "--heartbeat", type=float, metavar="SECONDS",
        help="renew held leases this often (default: $NINELIVES_HEARTBEAT or lease/3)",
    )  # fmt: skip
    p.add_argument(
        "--poll", type=float, metavar="SECONDS", help="look for work this often when idle (1)"
    )
    p.add_argument(
        "--grace", type=float, metavar="SECONDS",
        help="on SIGTERM, let running steps finish this long before giving them up (30)",
    )  # fmt: skip
    p.add_argument(
        "--drain", action="store_true", help="exit 0 once the queue has no unfinished task"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="log claims only, not steps")


def _run_args(p: argparse.ArgumentParser) -> None:
    _task_args(p)
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing per step")


def _status_args(p: argparse.ArgumentParser) -> None:
    _task_args(p)
    p.add_argument("--json", action="store_true", help="JSON even on a terminal")
    p.add_argument("--outputs", action="store_true", help="JSON with each step's output")


def _verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("task_id", metavar="TASK", nargs="?")
    p.add_argument("--all", action="store_true", help="check every task")
    p.add_argument("--artifacts", metavar="DIR", help="also check the published files in DIR")


def _torture_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", metavar="PLAN")
    p.add_argument("--kills", type=int, default=10, metavar="N", help="SIGKILLs (default 10)")
    p.add_argument("--seed", type=int, metavar="S", help="seed of the kill schedule")
    p.add_argument("--workers", type=int, default=1, metavar="K", help="tasks run in parallel")
    p.add_argument("--dir", metavar="DIR", help="scratch folder (default: a new temp folder)")
    p.add_argument(
        "--pause",
        type=float,
        default=0.01,
        metavar="SECONDS",
        help="sleep at every crash point so kills land between commits (default 0.01; 0: off)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")


#: Every command: its handler, its one-line help, and what declares its arguments.
COMMANDS: dict[str, tuple[Handler, str, Callable[[argparse.ArgumentParser], None]]] = {
    "create": (cmd_create, "store a task and its whole plan", _create_args),
    "submit": (
        cmd_submit, "store a task and enqueue it for workers (create --enqueue)", _submit_args
    ),
    "worker": (
        cmd_worker, "claim queued tasks and run them under a lease until SIGTERM/SIGINT",
        _worker_args,
    ),
    "run": (cmd_run, "recover, then run the task's pending steps until done", _run_args),
    "status": (cmd_status, "show the task and its steps", _status_args),
    "export": (cmd_export, "print the task's journal as JSON Lines", _task_args),
    "verify": (
        cmd_verify, "check tasks after the fact: journal, statuses, outputs, artifacts",
        _verify_args,
    ),
    "torture": (
        cmd_torture, "SIGKILL fresh tasks of a plan at random, resume them, verify", _torture_args
    ),
}  # fmt: skip


def _command_in(argv: Sequence[str]) -> str | None:
    """The command argparse will dispatch ``argv`` to, or None if that is unclear."""
    tokens = iter(argv)
    for token in tokens:
        if token == "--db":
            next(tokens, None)
        elif not token.startswith("-"):
            return token if token in COMMANDS else None
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser; given ``argv``, only the command it names gets its sub-parser.

    Each sub-parser costs ~0.3 ms to build (argparse looks up translations for
    every one), so a command builds only its own; without a recognisable
    command (``--help``, a typo) every command is declared, for help and errors.
    """
    parser = _Parser(
        prog="ninelives",
        description="Run agent tasks that survive being killed.",
        epilog=EPILOG,
        formatter_class=_Formatter,
    )
    parser.add_argument(
        "--db",
        default=os.environ.get("NINELIVES_DB") or "state.db",
        help="SQLite file or postgresql:// URL (default: $NINELIVES_DB or state.db)",
    )
    parser.add_argument("--version", action="version", version=f"ninelives {__version__}")
    # An explicit prog spares argparse a help formatter on every start-up.
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=_Parser, prog="ninelives"
    )
    sub.required = True
    only = _command_in(argv) if argv is not None else None
    for name, (handler, help, declare) in COMMANDS.items():
        if only is not None and name != only:
            continue
        p = sub.add_parser(name, help=help, description=help, formatter_class=_Formatter)
        p.add_argument("--db", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        p.set_defaults(handler=handler)
        declare(p)
    return parser


def exit_code(exc: BaseException) -> int:
    """The exit code of an error raised by a command."""
    for kind, code in EXIT_CODES:
        if isinstance(exc, kind):
            return code
    raise exc


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; print errors as one line on stderr; return the exit code."""
    try:
        argv = sys.argv[1:] if argv is None else argv
        args = build_parser(argv).parse_args(argv)
        return int(args.handler(args))
    except NineLivesError as exc:
        print(f"ninelives: error: {exc}", file=sys.stderr)
        return exit_code(exc)
    except KeyboardInterrupt:
        print("ninelives: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # A reader such as `head` went away; say nothing more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
