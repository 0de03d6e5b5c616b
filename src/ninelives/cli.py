"""The ``ninelives`` command: argparse over the library API.

Each handler parses, makes one library call and renders. Exit codes are
decided here, in :data:`EXIT_CODES`, and nowhere else. Only the standard
library is imported on this path; backends and tools load when used.
"""

from __future__ import annotations

import argparse
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
)

#: Exit code per error branch; the first matching class wins (subclasses first).
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (UnknownTask, 1),
    (TaskFailed, 2),
    (TaskBusy, 3),
    (InputError, 4),
    (CommitUnknown, 6),
    (StoreError, 5),
    (NineLivesError, 5),
)
EXIT_INTERRUPTED = 130

EPILOG = """exit codes:
  0  done (also when already done)     4  bad input (usage, plan, task id, existing id)
  1  unknown task                      5  database unusable (missing folder, corrupt, not SQLite)
  2  task failed (attempt limit)       6  a commit failed with an unknown outcome; run again
  3  another process runs this task  130  interrupted
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, and the bad-input code instead of argparse's 2 (which the
        # contract gives to "task failed").
        raise InputError(f"{message} (see '{self.prog} --help')")


def _runtime(args: argparse.Namespace, *, create: bool = True) -> Any:
    from .runtime import open as open_runtime

    log = None if getattr(args, "quiet", False) else _stderr
    return open_runtime(args.db, create=create, log=log)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def cmd_create(args: argparse.Namespace) -> int:
    with _runtime(args) as rt:
        task = rt.create(args.task_id, args.plan_file)
    print(f"created task {task.id!r} with {len(task.steps)} steps")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    with _runtime(args, create=False) as rt:
        task = rt.run(args.task_id)
    _stderr(f"{task.id}: {task.status.value}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    with _runtime(args, create=False) as rt:
        task = rt.status(args.task_id)
    if args.json or args.outputs or not sys.stdout.isatty():
        view = task.as_status()
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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    parser = _Parser(
        prog="ninelives",
        description="Run agent tasks that survive being killed.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--db",
        default=os.environ.get("NINELIVES_DB") or "state.db",
        help="SQLite file or postgresql:// URL (default: $NINELIVES_DB or state.db)",
    )
    parser.add_argument("--version", action="version", version=f"ninelives {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def command(name: str, handler: Callable[[argparse.Namespace], int], help: str) -> Any:
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument("--db", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        p.set_defaults(handler=handler)
        return p

    p = command("create", cmd_create, "store a task and its whole plan")
    p.add_argument("task_id", metavar="TASK_ID")
    p.add_argument("plan_file", metavar="PLAN_FILE")
    p = command("run", cmd_run, "recover, then run the task's pending steps until done")
    p.add_argument("task_id", metavar="TASK_ID")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing per step")
    p = command("status", cmd_status, "show the task and its steps")
    p.add_argument("task_id", metavar="TASK_ID")
    p.add_argument("--json", action="store_true", help="JSON even on a terminal")
    p.add_argument("--outputs", action="store_true", help="JSON with each step's output")
    p = command("export", cmd_export, "print the task's journal as JSON Lines")
    p.add_argument("task_id", metavar="TASK_ID")
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
        args = build_parser().parse_args(argv)
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
