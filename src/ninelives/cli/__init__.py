"""The ``ninelives`` command: argparse over the library API.

Each handler parses, makes one library call and renders. Exit codes are
decided here, in :data:`EXIT_CODES`, and nowhere else. The commands live in
one module per group (:mod:`.tasks`, :mod:`.decisions`, :mod:`.checks`,
:mod:`.ops`); everything written goes through :mod:`.output`. Only the
standard library is imported on this path; backends and tools load when used.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from ..errors import (
    CommitUnknown,
    InputError,
    NineLivesError,
    OutputFailed,
    StoreError,
    TaskBusy,
    TaskCancelled,
    TaskFailed,
    TaskParked,
    TasksLeft,
    UnknownTask,
    VerificationFailed,
    WorkflowError,
)
from ..version import __version__
from . import checks, decisions, ops, output, tasks
from .common import Command
from .output import printable, scrub

__all__ = ["COMMANDS", "EPILOG", "EXIT_CODES", "build_parser", "exit_code", "main", "printable"]

#: Exit code per error branch; the first matching class wins (subclasses first).
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (UnknownTask, 1),
    (TaskFailed, 2),
    (TaskBusy, 3),
    (InputError, 4),
    (CommitUnknown, 6),
    (StoreError, 5),
    (VerificationFailed, 7),
    (TaskParked, 8),
    (TaskCancelled, 9),
    (TasksLeft, 11),
    (OutputFailed, 10),
    (WorkflowError, 12),
    (NineLivesError, 5),
)
EXIT_INTERRUPTED = 130

EPILOG = """exit codes:
  0  done (also when already done)     4  bad input (usage, plan, task id, existing id,
  1  unknown task (also: no database      a tool missing here; nothing written)
     file, for a command on one task)  5  database missing (ls, gc, doctor, ui, verify --all),
  2  task failed (attempt or              unusable or unwritable, psycopg not installed,
     recovery limit)                      or this task's rows damaged
                                       6  an I/O error left a write's outcome unknown; run again
  3  another process runs this task    7  verify or torture found violations,
                                          or doctor problems (listed on stdout)
                                       8  the task waits for a person: resolve or approve
                                       9  the task was cancelled
                                      10  output could not be written (full disk, closed stdout)
                                      11  worker --drain left tasks it could not run (named)
                                      12  a workflow's code no longer matches the task's journal
                                     130  interrupted

example:
  ninelives create demo plan.json && ninelives run demo && ninelives status demo
"""


#: Every command, in the order ``--help`` lists them.
COMMANDS: dict[str, Command] = {
    **tasks.COMMANDS,
    **checks.COMMANDS,
    **ops.COMMANDS,
    **decisions.COMMANDS,
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, and the bad-input code instead of argparse's 2 (which the
        # contract gives to "task failed").
        raise InputError(f"{message} (see '{self.prog} --help')")

    def _print_message(self, message: str, file: Any = None) -> None:
        # argparse ignores a failed write of --help or --version; report it as
        # every other output failure is reported.
        if message and (file is None or file is sys.stdout):
            output.out(message.removesuffix("\n"))
            output.flush()
        else:
            super()._print_message(message, file)


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


def _db_arg(text: str) -> str:
    # An empty --db ('--db "$UNSET"') names no database: as a path it is the
    # working directory ("database path is a directory: " naming nothing).
    if not text:
        raise argparse.ArgumentTypeError("empty: give a SQLite file or a PostgreSQL URL")
    return text


def _takes_value(token: str) -> bool:
    # argparse also takes an option abbreviated (`--d` for `--db`, `--to` for
    # `--tools`): its value must not be taken for the command.
    return len(token) > 2 and any(name.startswith(token) for name in ("--db", "--tools"))


def _command_in(argv: Sequence[str]) -> str | None:
    """The command argparse will dispatch ``argv`` to, or None if that is unclear."""
    tokens = iter(argv)
    for token in tokens:
        if token == "--":
            return None
        if _takes_value(token):
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
        type=_db_arg,
        default=os.environ.get("NINELIVES_DB") or "state.db",
        help="SQLite file, postgresql:// URL or libpq keyword string ('host=H dbname=D'; "
        "default: $NINELIVES_DB or state.db)",
    )
    parser.add_argument(
        "--tools",
        default=None,
        metavar="MODULES",
        help="comma-separated modules whose tools create, run and worker load "
        "(default: $NINELIVES_TOOLS)",
    )
    parser.add_argument("--version", action="version", version=f"ninelives {__version__}")
    # An explicit prog spares argparse a help formatter on every start-up.
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=_Parser, prog="ninelives"
    )
    sub.required = True
    only = _command_in(argv) if argv is not None else None
    for name, command in COMMANDS.items():
        if only is not None and name != only:
            continue
        p = sub.add_parser(
            name, help=command.help, description=command.help, formatter_class=_Formatter,
            epilog=f"example:\n  {command.example}",
        )  # fmt: skip
        p.add_argument("--db", type=_db_arg, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        p.add_argument("--tools", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        p.set_defaults(handler=command.handler)
        command.declare(p)
    return parser


def exit_code(exc: BaseException) -> int:
    """The exit code of an error raised by a command."""
    for kind, code in EXIT_CODES:
        if isinstance(exc, kind):
            return code
    raise exc


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; print errors as one line on stderr; return the exit code.

    Output follows the usual Unix rules: a reader that goes away (EPIPE, as
    with ``| head``) ends the command quietly with its own code; output that
    cannot be written (ENOSPC, EIO, a closed stdout) is one line on stderr and
    exit 10, after whatever the command did (a ``create`` says its task was stored).
    """
    argv = sys.argv[1:] if argv is None else argv
    output.start(argv)
    try:
        try:
            args = build_parser(argv).parse_args(argv)
            code = int(args.handler(args))
        except SystemExit:  # --help, --version: argparse printed and exits
            output.flush()
            raise
        except (Exception, KeyboardInterrupt):
            raise  # an Exception not ours is a defect: its traceback is the report
        except BaseException as exc:
            raise _stopped_by(exc) from None
        output.flush()
        return code
    except NineLivesError as exc:
        if isinstance(exc, VerificationFailed | TaskFailed):
            try:
                output.flush()  # findings already printed must reach their reader
            except OutputFailed as failed:
                exc = failed
            except BrokenPipeError:
                return _reader_gone(exit_code(exc))
        if isinstance(exc, OutputFailed):
            output.drop_stdout()
        output.error(f"ninelives: error: {printable(scrub(str(exc)))}")
        return exit_code(exc)
    except KeyboardInterrupt:
        output.error("ninelives: interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _reader_gone(0)


def _stopped_by(exc: BaseException) -> StoreError:
    """The error of a BaseException user code raised (GeneratorExit, a library's
    own timeout or a test framework's failure) in a tool, a step or between a
    workflow's steps: no attempt can record it as its error, so it ends the run
    as it ends a worker's slot (exit 5), a step left running for the next run to
    recover, as after a kill."""
    from ..journal import clean_error, error_text

    said = error_text(exc).removesuffix(": ")  # GeneratorExit() says nothing more
    return StoreError(
        f"stopped by {clean_error(said)}, raised by code this command ran (a "
        "tool, a step or a workflow): it is not an Exception, so no attempt can record it "
        "as its error; a step it left running is recovered by the next run, as after a kill "
        "(raise an Exception instead)"
    )


def _reader_gone(code: int) -> int:
    # A reader such as `head` went away: say nothing more. Output still
    # buffered goes to /dev/null, so the interpreter's last flush cannot fail.
    output.drop_stdout()
    return code
