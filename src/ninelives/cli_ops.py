"""Commands that act on a task a person must look at, and housekeeping.

The handlers and argument declarations of ``ninelives`` commands beyond the
contract's (``resolve``, ``approve``, ``cancel``, ``fork``; ``ls``, ``gc``,
``doctor``), kept out of :mod:`ninelives.cli` so that each module stays small.
:data:`OPS` is merged into ``cli.COMMANDS``; exit codes are still decided by
``cli.EXIT_CODES`` alone. Like the rest of the CLI path, this module imports
only the standard library at start-up; a handler imports what it uses.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

#: ``name: (handler, help, declare)``, as ``cli.COMMANDS``.
OPS: dict[
    str,
    tuple[
        Callable[[argparse.Namespace], int],
        str,
        Callable[[argparse.ArgumentParser], None],
    ],
] = {}
#: The example that ends each command's ``--help``, as ``cli.EXAMPLES``.
EXAMPLES: dict[str, str] = {
    "cancel": "ninelives cancel nightly-42 --reason 'superseded by nightly-43'",
    "fork": "ninelives fork demo demo-v2 --from 1   # rerun from step 1 after a fix",
    "resolve": "ninelives resolve pay-7 2 --done '{\"charged\": true}'   # or --retry",
    "approve": "ninelives approve release-3 1 --note 'checked the diff'   # or --reject",
    "ls": "ninelives ls --status failed,blocked --limit 20",
    "gc": "ninelives gc --older-than 30d --dry-run",
    "doctor": "ninelives doctor   # then doctor --fix for what it can repair",
}


# -- report: a task's history as one HTML page ------------------------------


def cmd_report(args: argparse.Namespace) -> int:
    from . import __version__, cli
    from .report import render
    from .runtime import check_task_id

    check_task_id(args.task_id)
    from .store import journal

    with cli._reader(args) as store:
        task = store.get_task(args.task_id)
        page = render(task, journal(store, args.task_id), version=__version__)
    target = args.output if args.output is not None else f"report-{task.id}.html"
    if target == "-":
        cli._out(page)
        return 0
    if _write_file(target, page):
        cli._out(f"wrote {target} ({len(page.encode('utf-8'))} bytes): open it in a browser")
    return 0


def _write_file(path: str, text: str) -> bool:
    """Write ``text`` to ``path``; a failure is :class:`~ninelives.errors.OutputFailed`
    (exit 10). Returns False when ``path`` is this process's stdout, which got it.

    A regular file there (or nothing) is replaced whole or not at all: a
    temporary file renamed over it. Anything else is written through as a
    shell's ``>`` would, never replaced: a symlink (to a file, a FIFO,
    ``/dev/stdout``), a FIFO, a character device (``/dev/null``). A folder, a
    block device, a socket or a symlink to nothing is refused.
    """
    import os
    import stat

    try:
        st: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        return _write_through(path, text.encode("utf-8"))
    _replace_file(path, text)
    return True


def _cannot_write(path: str, exc: OSError | str) -> Exception:
    from .errors import OutputFailed

    why = exc if isinstance(exc, str) else exc.strerror or str(exc)
    return OutputFailed(f"cannot write {path}: {why}")


def _replace_file(path: str, text: str) -> None:
    import os
    import tempfile

    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".report-", suffix=".tmp")
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        os.unlink(tmp)
        raise _cannot_write(path, exc) from None


#: How long ``report -o FIFO`` waits for a process to open the FIFO for reading.
FIFO_READER_WAIT = 10.0


def _write_through(path: str, data: bytes) -> bool:
    """Write ``data`` into what ``path`` leads to, checked on the descriptor opened."""
    import os
    import stat

    from . import cli

    try:
        fd = _open_for_writing(path)
    except FileNotFoundError:  # a symlink whose target does not exist
        raise _cannot_write(path, "a symlink to nothing (not followed)") from None
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
            kind = "a folder" if stat.S_ISDIR(mode) else "not a file, FIFO or character device"
            raise _cannot_write(path, f"{kind}: nothing written")
        if _same_file(fd, 1):  # -o /dev/stdout: as -o -, in order with the rest of stdout
            cli._out(data.decode("utf-8"))
            return False
        if stat.S_ISREG(mode):
            os.ftruncate(fd, 0)  # a symlink to a file: its content, written as > would
        os.set_blocking(fd, True)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    finally:
        os.close(fd)
    return True


def _open_for_writing(path: str) -> int:
    """``path`` opened for writing without blocking, never created or truncated.
    A FIFO that no process reads yet (ENXIO) is tried again for
    :data:`FIFO_READER_WAIT` seconds, then refused, instead of blocking forever."""
    import errno
    import os
    import stat
    import time

    # A folder, a block device or a socket is refused before it is opened at all.
    mode = os.stat(path).st_mode
    for test, kind in ((stat.S_ISDIR, "a folder"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            raise OSError(errno.EINVAL, f"{kind}: nothing written")
    flags = os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    deadline = time.monotonic() + FIFO_READER_WAIT
    while True:
        try:
            return os.open(path, flags)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
        if time.monotonic() >= deadline:
            raise OSError(
                errno.ENXIO,
                f"a FIFO that no process opened for reading within {FIFO_READER_WAIT:g} s",
            )
        time.sleep(0.05)  # no event says a reader came: look again shortly


def _same_file(fd: int, other: int) -> bool:
    import os

    try:
        a, b = os.fstat(fd), os.fstat(other)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("task_id", metavar="TASK_ID")
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="where to write the page (default: report-TASK_ID.html here; - for stdout)",
    )


EXAMPLES["report"] = "ninelives report demo -o demo.html   # then open demo.html"
OPS["report"] = (
    cmd_report,
    "write the task's history as one self-contained HTML page: a lane per run, a bar per "
    "attempt, kills, recoveries, artifacts and the journal",
    _report_args,
)


# -- cancel and fork -----------------------------------------------------------


def cmd_cancel(args: argparse.Namespace) -> int:
    """``ninelives cancel TASK [--reason TEXT]``."""
    from . import cli

    with cli._runtime(args, create=False) as rt:
        task, changed = rt.cancel(args.task_id, reason=args.reason)
    if changed:
        cli._out(f"task {task.id!r} cancelled: it is not run again (a runner holding it stops "
                 "before its next step)")  # fmt: skip
    else:
        cli._out(f"task {task.id!r} was already cancelled")
    return 0


def _cancel_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("task_id", metavar="TASK")
    p.add_argument("--reason", metavar="TEXT", help="why, journaled in task_cancelled")


def cmd_fork(args: argparse.Namespace) -> int:
    """``ninelives fork TASK NEW_ID --from STEP [--queue NAME]``."""
    from . import cli

    with cli._runtime(args, create=False) as rt:
        task = rt.fork(args.task_id, args.new_id, start=args.start, queue=args.queue)
    copied = sum(1 for s in task.steps if s.output is not None)
    where = f" in queue {args.queue!r}" if args.queue else ""
    cli._out(
        f"forked task {task.id!r} from {args.task_id!r} at step {args.start}{where}: "
        f"{copied} step(s) copied done, {len(task.steps) - copied} to run"
    )
    return 0


def _fork_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("task_id", metavar="TASK")
    p.add_argument("new_id", metavar="NEW_ID")
    p.add_argument(
        "--from", dest="start", type=int, required=True, metavar="STEP",
        help="the first step the fork runs; the steps before it are copied done",
    )  # fmt: skip
    p.add_argument("--queue", metavar="NAME", help="also enqueue the fork for workers of NAME")


OPS["cancel"] = (
    cmd_cancel, "stop a task for good: a runner holding it stops before its next step", _cancel_args
)  # fmt: skip
OPS["fork"] = (
    cmd_fork, "a new task from a task's plan, reusing its outputs before a step", _fork_args
)  # fmt: skip


# -- a person in the loop: resolve, approve (unknown outcomes and approvals) --


def cmd_resolve(args: argparse.Namespace) -> int:
    from . import cli
    from .parking import resolve

    with cli._runtime(args, create=False) as rt:
        task = resolve(
            rt.store, args.task_id, args.step, done=args.done, retry=args.retry,
            max_output=rt.settings.max_output,
        )  # fmt: skip
    what = "done with the output given" if args.done is not None else "pending, to run again"
    cli._out(
        f"task {task.id!r} step {args.step} is {what}; the task is {task.status.value}: "
        f"'ninelives run {task.id}' resumes it"
    )
    return 0


def _resolve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("task_id", metavar="TASK_ID")
    p.add_argument("step", type=int, metavar="STEP", help="the blocked step's index")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--done", metavar="JSON",
        help="its effect happened: this JSON object becomes the step's output",
    )  # fmt: skip
    how.add_argument("--retry", action="store_true", help="it did not happen: run it again")


def cmd_approve(args: argparse.Namespace) -> int:
    from . import cli
    from .parking import approve

    with cli._runtime(args, create=False) as rt:
        task = approve(rt.store, args.task_id, args.step, reject=args.reject, note=args.note)
    if args.reject and task.status.value == "failed":
        cli._out(f"task {task.id!r} step {args.step} rejected: the task has failed")
    elif args.reject:
        cli._out(
            f"task {task.id!r} step {args.step} rejected; the workflow reads the rejection and "
            f"the task is {task.status.value}: 'ninelives run {task.id}' resumes it"
        )
    else:
        cli._out(
            f"task {task.id!r} step {args.step} approved; the task is {task.status.value}: "
            f"'ninelives run {task.id}' resumes it"
        )
    return 0


def _approve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("task_id", metavar="TASK_ID")
    p.add_argument("step", type=int, metavar="STEP", help="the waiting approval step's index")
    p.add_argument("--reject", action="store_true", help="reject: the task fails")
    p.add_argument("--note", metavar="TEXT", help="why (a rejection's note is the task's reason)")


OPS["resolve"] = (
    cmd_resolve,
    "say what happened to a blocked step (its outcome was unknown): --done JSON or --retry",
    _resolve_args,
)
OPS["approve"] = (
    cmd_approve,
    "approve (or --reject) a step waiting for a person; the task goes on (or fails)",
    _approve_args,
)


# -- housekeeping: ls, gc, doctor ------------------------------------------------


def _housekeeping_store(args: argparse.Namespace, *, write: bool) -> object:
    """The store of ``--db`` for a housekeeping command: read-only unless ``write``;
    a database that does not exist is an error, never created."""
    from .errors import StoreError
    from .store import MissingStore, open_store

    store = open_store(args.db, create=False, readonly=not write)
    if isinstance(store, MissingStore):
        raise StoreError(f"no database at {args.db} ('ninelives create' makes one)")
    return store


def age(seconds: float) -> str:
    """An age as ``ls`` and the web view show it: ``45s``, ``12m``, ``3h``, ``2d``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(int(seconds), 0)}s"


def cmd_ls(args: argparse.Namespace) -> int:
    import time

    from . import cli
    from .errors import InputError
    from .housekeeping import parse_statuses
    from .models import TaskStatus
    from .runtime import check_queue

    statuses = parse_statuses(args.status, [s.value for s in TaskStatus]) if args.status else []
    queue = check_queue(args.queue) if args.queue is not None else None
    if not 1 <= args.limit <= 10000:
        raise InputError(f"--limit must be 1-10000, got {args.limit}")
    store: Any = _housekeeping_store(args, write=False)
    try:
        tasks = store.list_tasks(statuses=statuses, queue=queue, limit=args.limit)
    finally:
        store.close()
    now = time.time()
    if args.json or not cli._on_terminal():
        for t in tasks:
            cli._out(cli.json_line(t.as_json(now)))
        return 0
    width = max([len(t.id) for t in tasks] + [4])
    cli._out(f"{'TASK':<{width}}  {'STATUS':<9} {'STEPS':>7} {'TRIES':>5} {'AGE':>5}  LAST EVENT")
    for t in tasks:
        steps = f"{t.steps_done}/{t.steps_total}"
        last = f"{t.last_event} {age(now - t.last_ts)} ago" if t.last_ts is not None else "-"
        cli._out(
            cli.printable(
                f"{t.id:<{width}}  {t.status:<9} {steps:>7} {t.attempts:>5} "
                f"{age(now - t.created_at):>5}  {last}"
            )
        )
    return 0


def _ls_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--status", metavar="S[,S...]", help="only tasks of these statuses")
    p.add_argument("--queue", metavar="NAME", help="only tasks of this queue")
    p.add_argument("--limit", type=int, default=50, metavar="N", help="at most N tasks (50)")
    p.add_argument("--json", action="store_true", help="JSON Lines even on a terminal")


def cmd_gc(args: argparse.Namespace) -> int:
    from . import cli
    from .errors import InputError
    from .housekeeping import FINISHED, gc, parse_duration, parse_statuses

    older_than = parse_duration(args.older_than)
    statuses = parse_statuses(args.status, FINISHED) if args.status else list(FINISHED)
    if not 1 <= args.batch <= 100000:
        raise InputError(f"--batch must be 1-100000, got {args.batch}")
    verb = "would remove" if args.dry_run else "removed"

    def progress(batch: list[tuple[str, str]]) -> None:
        if not args.json:
            for task_id, status in batch:
                cli._out(cli.printable(f"{verb} {task_id} ({status})"))
            cli._flush()

    store: Any = _housekeeping_store(args, write=not args.dry_run)
    try:
        report = gc(store, older_than=older_than, statuses=statuses, dry_run=args.dry_run,
                    batch=args.batch, progress=progress)  # fmt: skip
    finally:
        store.close()
    if args.json:
        cli._out(cli.json_line(report.as_json()))
        return 0
    for name in report.blobs:
        cli._out(cli.printable(f"{verb} blob {name}"))
    for name in report.temps:
        cli._out(cli.printable(f"{verb} temporary blob file {name}"))
    rows = "" if args.dry_run else f", {report.steps} step(s), {report.events} event(s)"
    held = f"; {report.skipped} left (held or changed meanwhile)" if report.skipped else ""
    cli._out(f"gc: {verb} {len(report.removed)} task(s){rows}, {len(report.blobs)} blob(s){held}")
    return 0


def _gc_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--older-than", required=True, metavar="DURATION",
        help="only tasks last changed longer ago than this: 30d, 12h, 15m, 0s",
    )  # fmt: skip
    p.add_argument(
        "--status", metavar="S[,S...]",
        help="finished statuses to remove (default done,failed,cancelled)",
    )  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="list what would go; remove nothing")
    p.add_argument(
        "--batch", type=int, default=500, metavar="N", help="tasks per transaction (500)"
    )
    p.add_argument("--json", action="store_true", help="one JSON object: counts and tasks")


def cmd_doctor(args: argparse.Namespace) -> int:
    from . import cli
    from .errors import VerificationFailed
    from .housekeeping import doctor
    from .settings import Settings

    store: Any = _housekeeping_store(args, write=args.fix)
    try:
        findings, fixed = doctor(store, artifacts=Settings.from_env().artifacts, fix=args.fix)
    finally:
        store.close()
    if args.json:
        cli._out(cli.json_line({
            "ok": not findings, "findings": [f.as_json() for f in findings],
            "fixed": [f.as_json() for f in fixed],
        }))  # fmt: skip
    else:
        for f in fixed:
            cli._out(cli.printable(f"fixed {f.kind}: {f.subject}: {f.detail}"))
        for f in findings:
            cli._out(cli.printable(f.line()))
        cli._out(f"doctor: {len(findings)} finding(s)" if findings else "doctor: no findings")
    if findings:
        cli._flush()
        raise VerificationFailed(f"doctor found {len(findings)} problem(s)")
    return 0


def _doctor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fix", action="store_true", help="repair what can be repaired safely")
    p.add_argument("--json", action="store_true", help="one JSON object: findings and fixes")


OPS.update(
    {
        "ls": (cmd_ls, "list tasks, newest first: status, steps done, attempts, age", _ls_args),
        "gc": (cmd_gc, "delete finished tasks older than a duration, with their journal", _gc_args),
        "doctor": (cmd_doctor, "check the database and its folders; exit 7 on findings",
                   _doctor_args),
    }
)  # fmt: skip


# -- ui: a read-only local web view -----------------------------------------


def cmd_ui(args: argparse.Namespace) -> int:
    import sys

    from . import cli
    from .webui import LOOPBACK, serve

    def open_store() -> Any:
        return _housekeeping_store(args, write=False)

    open_store().close()  # a database that is not there is an error now, not per page
    server = serve(
        args.db, open_store, host=args.host, port=args.port, allow_remote=args.allow_remote
    )
    host, port = str(server.server_address[0]), int(server.server_address[1])
    shown = f"[{host}]" if ":" in host else host
    if args.host not in LOOPBACK:
        cli._stderr(
            f"WARNING: serving {args.host}:{port} to other machines, without authentication"
        )
    cli._out(f"serving http://{shown}:{port}/ (read-only; Ctrl-C stops)")
    cli._flush()
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    sys.stdout.flush()
    return 0


def _ui_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0: any free port)")
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a --host other than loopback (the view has no authentication)",
    )


EXAMPLES["ui"] = "ninelives ui --port 8765   # then open http://127.0.0.1:8765/"
OPS["ui"] = (
    cmd_ui,
    "serve a read-only web view of the tasks on 127.0.0.1: list, timelines, fleet, /metrics",
    _ui_args,
)


# -- durable code: create --workflow, status, replay-check


def workflow_task(args: argparse.Namespace) -> tuple[Any, list[Any], dict[str, Any]]:
    """``create --workflow NAME --args JSON``: the workflow and its arguments, checked."""
    from .durable import lookup, parse_arguments, prepare
    from .errors import InputError

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


# -- replay-check ---------------------------------------------------


def cmd_replay_check(args: argparse.Namespace) -> int:
    """``ninelives replay-check (TASK | --all)``: replay each unfinished workflow task
    on the code loaded here, running no step; exit 7 with one line per divergence."""
    from . import cli
    from .errors import InputError, VerificationFailed
    from .models import TaskStatus, is_workflow
    from .replay import replay_check
    from .tools.builtin import default_registry

    if (args.task_id is None) != args.all:
        raise InputError("give a TASK or --all, not both (see 'ninelives replay-check --help')")
    default_registry(cli._settings(args))  # imports the --tools modules: their workflows
    finished = (TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.CANCELLED)
    found: list[str] = []
    checked = 0
    with cli._reader(args) as store:
        ids = store.task_ids() if args.all else [args.task_id]
        for task_id in ids:
            task = store.get_task(task_id)
            if not is_workflow(task.goal):
                if args.all:
                    continue
                raise InputError(f"task {task_id!r} is not a workflow task: nothing to replay")
            if args.all and task.status in finished:
                continue
            checked += 1
            diverged = replay_check(task)
            if diverged is not None:
                called = diverged.called if diverged.called is not None else "(returns)"
                found.append(
                    f"{diverged.task_id}: step {diverged.step}: journal {diverged.stored!r}, "
                    f"code {called!r}"
                )
    for line in found:
        cli._out(cli.printable(line))
    if found:
        cli._flush()
        raise VerificationFailed(f"{len(found)} of {checked} workflow task(s) diverge")
    cli._out(f"replay-check: {checked} workflow task(s) replay on this code")
    return 0


def _replay_check_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("task_id", metavar="TASK", nargs="?")
    p.add_argument("--all", action="store_true", help="every unfinished workflow task")


EXAMPLES["replay-check"] = "ninelives --tools flows replay-check --all   # before a deploy"
OPS["replay-check"] = (
    cmd_replay_check,
    "replay unfinished workflow tasks on this code, running no step: report any divergence",
    _replay_check_args,
)
