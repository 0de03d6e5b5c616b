"""The ``ninelives`` command: argparse over the library API.

Each handler parses, makes one library call and renders. Exit codes are
decided here, in :data:`EXIT_CODES`, and nowhere else. Only the standard
library is imported on this path; backends and tools load when used.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from . import __version__
from .cli_ops import EXAMPLES as OPS_EXAMPLES
from .cli_ops import OPS
from .errors import (
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
  1  unknown task                         a tool missing here; nothing written)
  2  task failed (attempt or           5  database unusable, or this task's rows damaged
     recovery limit)                   6  an I/O error left a write's outcome unknown; run again
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

#: The example that ends each command's ``--help`` (a test checks every command has one).
EXAMPLES = {
    "create": "ninelives create demo examples/demo/plan.json",
    "submit": "ninelives submit nightly-42 plan.json --queue nightly",
    "worker": "NINELIVES_DB=postgresql://db/ninelives ninelives worker --queue nightly "
    "--concurrency 4",
    "run": "ninelives run demo          # resumes where the last run stopped",
    "retry": "ninelives retry demo        # after fixing what made its step fail",
    "status": "ninelives status demo --json --outputs",
    "export": "ninelives export demo --format otlp-json > demo.trace.json",
    "verify": "ninelives verify --all --artifacts artifacts",
    "torture": "ninelives torture examples/demo/plan.json --kills 20 --seed 7",
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
            _out(message.removesuffix("\n"))
            _flush()
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


def _settings(args: argparse.Namespace) -> Any:
    """The environment's settings, with ``--tools`` in place of ``NINELIVES_TOOLS``."""
    from .settings import Settings, parse_tool_modules

    settings = Settings.from_env()
    tools = getattr(args, "tools", None)
    if tools is not None:
        settings = settings._replace(tool_modules=parse_tool_modules(tools))
    return settings


def _runtime(args: argparse.Namespace, *, create: bool = True, readonly: bool = False) -> Any:
    from .runtime import open as open_runtime

    quiet = getattr(args, "quiet", False)
    log = None if quiet else _stderr
    return open_runtime(
        args.db, settings=_settings(args), create=create, readonly=readonly, log=log,
        on_progress=None if quiet or readonly else _progress_bar(),
    )  # fmt: skip


def _reader(args: argparse.Namespace) -> Any:
    """The database opened for reading only, for commands that only read: no
    runtime, settings or tools imported (a cold ``status`` starts faster)."""
    from contextlib import closing

    from .store import open_store

    return closing(open_store(args.db, readonly=True))


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


# Characters that a terminal acts on instead of showing: C0 and C1 controls
# (ESC, CSI, OSC, "\r", "\n"), DEL, and the bidirectional and line-separator
# formats that reorder what is shown. Stored text (a plan's goal, a tool's
# output or error, a file name) is data: in a human view it is escaped.
_UNSAFE = "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]"
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(match: Any) -> str:
    char = str(match.group())
    return _NAMED.get(char) or (
        f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"
    )


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on escaped (``\\x1b``, ``\\n``)."""
    import re

    return re.sub(_UNSAFE, _escape_char, text)


def _json_escape(match: Any) -> str:
    return f"\\u{ord(match.group()):04x}"


def json_line(value: Any) -> str:
    """``value`` as one line of JSON in which no character can act on a terminal.

    ``json.dumps`` already escapes C0 controls; C1 controls, DEL and the
    bidirectional formats are escaped as ``\\uXXXX`` too: the same JSON value.
    Non-finite numbers of rows written before they were refused print as ``null``.
    """
    import re

    from .journal import printable_json

    return re.sub(_UNSAFE, _json_escape, printable_json(value))


def _no_secrets(text: str) -> str:
    return text


#: Removes database passwords from every line this process prints (see :func:`_redactor`).
_scrub: Callable[[str], str] = _no_secrets


def _redactor(argv: Sequence[str]) -> Callable[[str], str]:
    """A scrubber for the passwords of every PostgreSQL URL this command was given.

    The store already keeps them out of its messages; this is the last line
    before the terminal, for anything that echoes its input (a URL given
    where a task id was expected, say).
    """
    urls = []
    for text in (*argv, os.environ.get("NINELIVES_DB", "")):
        at = max(text.find("postgresql://"), text.find("postgres://"))
        if at >= 0:
            urls.append(text[at:])
    if not urls:
        return _no_secrets
    from .store.conninfo import Redactor

    return Redactor(urls)


def _stderr(line: str) -> None:
    # Progress lines are best effort: a stderr that fails (EIO, a full disk
    # under a log file) must not stop a runner whose state is committed.
    def emit() -> None:
        try:
            text = printable(_scrub(line))
            print(_paint(text) if _colour() else text, file=sys.stderr, flush=True)
        except (OSError, ValueError, AttributeError):
            pass

    if _BAR is None:
        emit()
    else:
        _BAR.above(emit)  # the line takes the place of the live bar


#: The live progress bar on stderr, once a command asked for one on a terminal.
_BAR: Any = None


def _progress_bar() -> Callable[[Any], None] | None:
    """The ``on_progress`` callback: a bar on stderr if it is a terminal, else None."""
    global _BAR
    from .cli_bar import terminal_bar

    _BAR = _BAR or terminal_bar(sys.stderr, lambda text: printable(_scrub(text)))
    return None if _BAR is None else _BAR.update


@functools.cache
def _colour() -> bool:
    """Colour on a terminal only, and never with ``NO_COLOR`` set (no-color.org)."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (OSError, ValueError):
        return False


_GREEN, _YELLOW, _RED, _RESET = "\x1b[32m", "\x1b[33m", "\x1b[31m", "\x1b[0m"


def _paint(line: str) -> str:
    """Colour the outcome words of a progress line. It runs after :func:`printable`,
    which escapes every control character that stored data could carry, so the
    only escape sequences on the line are these."""
    import re

    line = line.replace(" done in ", f" {_GREEN}done{_RESET} in ", 1)
    line = line.replace(" (recovered)", f" {_YELLOW}(recovered){_RESET}", 1)
    line = line.replace(": recovered step(s)", f": {_YELLOW}recovered step(s){_RESET}", 1)
    if line.endswith(": done"):
        line = f"{line[:-4]}{_GREEN}done{_RESET}"
    return re.sub(r"( attempt \d+: )", f"{_RED}\\1{_RESET}", line, count=1)


def _on_terminal() -> bool:
    stream = sys.stdout
    try:
        return stream is not None and not _STDOUT_CLOSED and stream.isatty()
    except (OSError, ValueError):
        return False


def _out(line: str) -> None:
    """One line on stdout. A reader that went away (EPIPE) raises BrokenPipeError;
    any other failure (ENOSPC, EIO, a closed stdout) raises :class:`OutputFailed`."""
    stream = sys.stdout
    if stream is None or _STDOUT_CLOSED:
        raise OutputFailed("cannot write to stdout: it is closed")
    try:
        stream.write(line + "\n")
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OutputFailed(f"cannot write to stdout: {exc.strerror or exc}") from None


def _flush() -> None:
    """Push buffered output out now, while a failure can still be reported."""
    stream = sys.stdout
    if stream is None:
        return
    try:
        stream.flush()
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as exc:
        raise OutputFailed(
            f"cannot write to stdout: {getattr(exc, 'strerror', None) or exc}"
        ) from None


_STDOUT_CLOSED = False


def cmd_create(args: argparse.Namespace) -> int:
    from .runtime import check_queue, prepare
    from .runtime import open as open_runtime
    from .tools.builtin import default_registry

    settings = _settings(args)
    tools = default_registry(settings)  # imports the --tools modules: their workflows too
    # Id, plan and queue are checked before the database is opened: bad input
    # must not leave a new database file behind.
    if args.workflow is not None:
        made = _workflow_task(args)
    elif args.plan_file is None or args.args is not None:
        raise InputError(
            f"give a PLAN_FILE, or --workflow NAME [--args JSON] "
            f"(see 'ninelives {args.command} --help')"
        )
    else:
        made = (prepare(args.task_id, args.plan_file, tools), [], {})
    queue = check_queue(_queue(args)) if args.enqueue or args.queue is not None else None
    with open_runtime(args.db, settings=settings, tools=tools) as rt:
        plan, positional, keywords = made
        task = rt.create(args.task_id, plan, *positional, queue=queue, **keywords)
    where = f" in queue {queue!r}" if queue else ""
    try:
        what = (
            f"workflow {args.workflow!r}"
            if args.workflow is not None
            else _plural(len(task.steps), "step")
        )
        _out(f"created task {task.id!r} with {what}{where}")
        _flush()
    except OutputFailed as exc:
        # The task is stored: saying only "error" would invite a second create.
        raise OutputFailed(f"task {task.id!r} was stored, but {exc}") from None
    return 0


def _workflow_task(args: argparse.Namespace) -> tuple[Any, list[Any], dict[str, Any]]:
    """``create --workflow NAME --args JSON``: the workflow and its arguments, checked."""
    from .durable import lookup, parse_arguments, prepare

    if args.plan_file is not None:
        raise InputError(
            f"give either a PLAN_FILE or --workflow, not both "
            f"(see 'ninelives {args.command} --help')"
        )
    flow = lookup(args.workflow)
    positional, keywords = parse_arguments(args.args if args.args is not None else "[]")
    prepare(args.task_id, flow, positional, keywords)
    return flow, positional, keywords


def _queue(args: argparse.Namespace) -> str:
    if args.queue is not None:  # given, even empty: checked as given
        return str(args.queue)
    return os.environ.get("NINELIVES_QUEUE") or "default"


def cmd_submit(args: argparse.Namespace) -> int:
    args.enqueue = True
    return cmd_create(args)


def cmd_worker(args: argparse.Namespace) -> int:
    from .tools.builtin import default_registry
    from .worker import Worker, WorkerOptions

    options = WorkerOptions.from_env(
        args.db, queue=args.queue, concurrency=args.concurrency, lease=args.lease,
        heartbeat=args.heartbeat, poll=args.poll, grace=args.grace, drain=args.drain,
        group_commit=args.group_commit or None, group_linger_ms=args.group_commit_linger_ms,
    )  # fmt: skip
    settings = _settings(args)
    worker = Worker(
        options, settings=settings, tools=default_registry(settings), log=_stderr,
        step_log=None if args.quiet else _stderr,
        on_progress=None if args.quiet else _progress_bar(),
    )  # fmt: skip
    return worker.run()


def cmd_run(args: argparse.Namespace) -> int:
    with _runtime(args, create=False) as rt:
        task = rt.run(args.task_id)
    _stderr(f"{task.id}: {task.status.value}")
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    with _runtime(args, create=False) as rt:
        task = rt.retry(args.task_id, step=args.step)
    _out(f"task {task.id!r} is pending again: 'ninelives run {task.id}' resumes it")
    return 0


def _elide(shown: str) -> str:
    return shown if len(shown) <= 72 else shown[:71] + "…"


def _utc(ts: float) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def cmd_status(args: argparse.Namespace) -> int:
    from .journal import calls_models, model_usage

    as_json = args.json or not _on_terminal()
    with _reader(args) as store:
        task = store.get_task(args.task_id)
        # Only a task that calls models gets the cost keys: the guide's tasks
        # keep exactly the contract's four.
        usage = model_usage(task, store.events(task.id)) if as_json and calls_models(task) else {}
        flow = _workflow_view(store, task)
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
        _out(json_line(view))
        return 0
    goal = f"workflow {flow['workflow']}" if flow else task.goal
    _out(printable(f"task {task.id}: {task.status.value}  ({goal})"))
    if "result" in flow:
        _out(printable(f"  result: {_elide(json_line(flow['result']))}"))
    for step in task.steps:
        tool = printable(step.tool)
        _out(f"  {step.idx:>3}  {tool:<16} {step.status.value:<8} attempts={step.attempts}")
        if step.not_before is not None:
            _out(f"         not before {_utc(step.not_before)} (backoff)")
        if step.progress is not None:
            _out(printable(f"         progress: {_elide(json_line(step.progress))}"))
        if args.outputs and step.output is not None:
            for key, value in step.output.items():
                _out(printable(f"         {key}: {_elide(json_line(value))}"))
    return 0


def _workflow_view(store: Any, task: Any) -> dict[str, Any]:
    """``status --json``'s keys of a workflow task: ``workflow``, ``version``, ``args``,
    ``kwargs`` and, once done, ``result``; nothing for a plan's task."""
    from .durable import spec_of
    from .models import TaskStatus

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


def cmd_export(args: argparse.Namespace) -> int:
    from .store import journal

    with _reader(args) as store:
        events = journal(store, args.task_id)
        task = store.get_task(args.task_id) if args.format == "otlp-json" else None
    if args.format == "csv":
        from .traces import csv_lines

        for line in csv_lines(events):
            _out(line)
    elif task is not None:
        from .traces import otlp_request

        _out(json_line(otlp_request(task, events, version=__version__)))
    else:
        for event in events:
            _out(json_line(event.as_export()))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from .settings import Settings
    from .store import MissingStore
    from .verify import verify_store

    settings = Settings.from_env()
    if (args.task_id is None) != args.all:
        raise InputError("give a TASK or --all, not both (see 'ninelives verify --help')")
    if args.artifacts is not None and os.path.exists(args.artifacts):
        if not os.path.isdir(args.artifacts):
            raise InputError(f"--artifacts {args.artifacts}: not a folder")
    with _reader(args) as store:
        if args.all and isinstance(store, MissingStore):
            raise StoreError(f"no database at {args.db}")
        ids = None if args.all else [args.task_id]
        limits = (settings.max_attempts, settings.max_recoveries)
        report = verify_store(store, ids, artifacts=args.artifacts, limits=limits)
    for violation in report.violations:
        _out(printable(_scrub(str(violation))))
    integrity = ", integrity checked" if report.integrity_checked else ""
    summary = f"verified {report.tasks} task(s), {report.events} event(s){integrity}"
    if report.ok:
        _out(f"{summary}: no violations")
        return 0
    _out(f"{summary}: {len(report.violations)} violation(s)")
    _flush()  # the list is the finding: a failure to print it is not "violations"
    tampered = sorted({v.task_id for v in report.violations if v.check == "plan_integrity"})
    if tampered:  # refused as run refuses it: exit 5, naming the task
        from .errors import PlanTampered

        named = ", ".join(repr(t) for t in tampered)
        raise PlanTampered(
            f"task {named}: stored goal or steps changed since create (SHA-256 mismatch)",
            task_id=tampered[0],
        )
    raise VerificationFailed(f"{len(report.violations)} violation(s) found")


def cmd_torture(args: argparse.Namespace) -> int:
    from .torture import torture

    if args.tools is not None:
        # The plan is checked here and run by child processes: both read the variable.
        os.environ["NINELIVES_TOOLS"] = args.tools
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
        _out(printable(line))
    if not report.ok:
        _flush()
        raise VerificationFailed(
            f"{report.duplicates} duplicate(s), {report.lost_commits} lost commit(s), "
            f"{len(report.violations)} violation(s); replay with --seed {report.seed}"
        )
    return 0


Handler = Callable[[argparse.Namespace], int]
QUEUE_HELP = "the workers' queue (default: $NINELIVES_QUEUE or 'default')"


def _task_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("task_id", metavar="TASK_ID")


def _export_args(p: argparse.ArgumentParser) -> None:
    _task_args(p)
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
        "--group-commit-linger-ms", type=float, metavar="MS",
        help="the longest a transition waits for others to join its batch "
        "(default: $NINELIVES_GROUP_COMMIT_LINGER_MS or 2)",
    )  # fmt: skip
    p.add_argument("-q", "--quiet", action="store_true", help="log claims only, not steps")


def _run_args(p: argparse.ArgumentParser) -> None:
    _task_args(p)
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing per step")


def _status_args(p: argparse.ArgumentParser) -> None:
    _task_args(p)
    p.add_argument("--json", action="store_true", help="JSON even on a terminal")
    p.add_argument("--outputs", action="store_true", help="also each done step's output")


def _retry_args(p: argparse.ArgumentParser) -> None:
    _task_args(p)
    p.add_argument(
        "--step", type=int, metavar="N",
        help="refuse unless step N is the one that failed (a guard for scripts)",
    )  # fmt: skip


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
    "retry": (
        cmd_retry, "move a failed task back to pending, its failed step's attempts reset",
        _retry_args,
    ),
    "status": (cmd_status, "show the task and its steps", _status_args),
    "export": (
        cmd_export, "print the task's journal (JSON Lines, CSV or an OTLP trace)", _export_args
    ),
    "verify": (
        cmd_verify, "check tasks after the fact: journal, statuses, outputs, artifacts",
        _verify_args,
    ),
    "torture": (
        cmd_torture, "SIGKILL fresh tasks of a plan at random, resume them, verify", _torture_args
    ),
}  # fmt: skip
COMMANDS.update(OPS)


def _command_in(argv: Sequence[str]) -> str | None:
    """The command argparse will dispatch ``argv`` to, or None if that is unclear."""
    tokens = iter(argv)
    for token in tokens:
        if token in ("--db", "--tools"):
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
    for name, (handler, help, declare) in COMMANDS.items():
        if only is not None and name != only:
            continue
        example = EXAMPLES.get(name) or OPS_EXAMPLES.get(name, "")
        p = sub.add_parser(
            name, help=help, description=help, formatter_class=_Formatter,
            epilog=f"example:\n  {example}" if example else None,
        )  # fmt: skip
        p.add_argument("--db", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        p.add_argument("--tools", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
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
    """Run one command; print errors as one line on stderr; return the exit code.

    Output follows the usual Unix rules: a reader that goes away (EPIPE, as
    with ``| head``) ends the command quietly with its own code; output that
    cannot be written (ENOSPC, EIO, a closed stdout) is one line on stderr and
    exit 10, after whatever the command did (a ``create`` says its task was stored).
    """
    global _scrub
    _guard_std_fds()
    argv = sys.argv[1:] if argv is None else argv
    _scrub = _redactor(argv)
    try:
        try:
            args = build_parser(argv).parse_args(argv)
            code = int(args.handler(args))
        except SystemExit:  # --help, --version: argparse printed and exits
            _flush()
            raise
        _flush()
        return code
    except NineLivesError as exc:
        if isinstance(exc, VerificationFailed | TaskFailed):
            try:
                _flush()  # findings already printed must reach their reader
            except OutputFailed as failed:
                exc = failed
            except BrokenPipeError:
                return _reader_gone(exit_code(exc))
        if isinstance(exc, OutputFailed):
            _drop_stdout()
        _error(f"ninelives: error: {printable(_scrub(str(exc)))}")
        return exit_code(exc)
    except KeyboardInterrupt:
        _error("ninelives: interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _reader_gone(0)


def _reader_gone(code: int) -> int:
    # A reader such as `head` went away: say nothing more. Output still
    # buffered goes to /dev/null, so the interpreter's last flush cannot fail.
    _drop_stdout()
    return code


def _drop_stdout() -> None:
    _occupy(1)


def _error(line: str) -> None:
    def emit() -> None:
        try:
            print(line, file=sys.stderr, flush=True)
        except (OSError, ValueError, AttributeError):
            pass  # stderr itself is gone: the exit code still tells

    if _BAR is None:
        emit()
    else:
        _BAR.above(emit)  # the message takes the place of the live bar


def _guard_std_fds() -> None:
    """Occupy a closed stdout or stderr with /dev/null, remembering a closed stdout.

    Otherwise the next file opened (a lock file, a database) would get the
    descriptor, and output meant for the terminal would land in it.
    """
    global _STDOUT_CLOSED
    _STDOUT_CLOSED = False
    for fd in (1, 2):
        try:
            os.fstat(fd)
        except OSError:
            _STDOUT_CLOSED = _STDOUT_CLOSED or fd == 1
            _occupy(fd)


def _occupy(fd: int) -> None:
    """Point ``fd`` at /dev/null (whether it was open or closed)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
    except OSError:
        pass
