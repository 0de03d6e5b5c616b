"""The commands that look after a database as a whole: ``report`` (one task's
history as an HTML page), ``ls``, ``gc``, ``doctor`` and ``ui`` (a read-only
web view). Standard library only at import; a handler imports what it uses.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..humanize import age
from .common import Command, integer, open_existing, open_reader
from .output import flush, json_line, on_terminal, out, printable, say, write_file


def cmd_report(args: argparse.Namespace) -> int:
    from ..names import check_task_id
    from ..report import render
    from ..version import __version__

    check_task_id(args.task_id)
    if args.output == "":  # a script's `-o "$OUT"` with OUT unset
        from ..errors import InputError

        raise InputError("-o is empty: name the file to write, or - for stdout")
    from ..store import journal

    with open_reader(args) as store:
        task = store.get_task(args.task_id)
        page = render(task, journal(store, args.task_id), version=__version__)
    target = args.output if args.output is not None else f"report-{task.id}.html"
    if target == "-":
        out(page)
        return 0
    if write_file(target, page, database=args.db):
        out(f"wrote {target} ({len(page.encode('utf-8'))} bytes): open it in a browser")
    return 0


def _report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("task_id", metavar="TASK_ID")
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="where to write the page (default: report-TASK_ID.html here; - for stdout)",
    )


def cmd_ls(args: argparse.Namespace) -> int:
    import time

    from ..errors import InputError
    from ..housekeeping import parse_statuses
    from ..models import DAMAGED, TaskStatus
    from ..names import check_queue

    if args.status and DAMAGED in (s.strip() for s in args.status.split(",")):
        # ls shows it, so it is asked for; but no row stores it (it is what a row
        # that cannot be read is shown as), and finding those reads every row.
        raise InputError(
            f"{DAMAGED} is not a stored status; 'ninelives verify --all' names the damaged tasks"
        )
    every = [s.value for s in TaskStatus]
    statuses = parse_statuses(args.status, every) if args.status is not None else []
    queue = check_queue(args.queue) if args.queue is not None else None
    if not 1 <= args.limit <= 10000:
        raise InputError(f"--limit must be 1-10000, got {args.limit}")
    store: Any = open_existing(args, write=False)
    try:
        tasks = store.list_tasks(statuses=statuses, queue=queue, limit=args.limit)
    finally:
        store.close()
    now = time.time()
    if args.json or not on_terminal():
        for t in tasks:
            out(json_line(t.as_json(now)))
        return 0
    width = max([len(t.id) for t in tasks] + [4])
    out(f"{'TASK':<{width}}  {'STATUS':<9} {'STEPS':>7} {'TRIES':>5} {'AGE':>5}  LAST EVENT")
    for t in tasks:
        steps = f"{t.steps_done}/{t.steps_total}"
        last = f"{t.last_event} {age(now - t.last_ts)} ago" if t.last_ts is not None else "-"
        out(
            printable(
                f"{t.id:<{width}}  {t.status:<9} {steps:>7} {t.attempts:>5} "
                f"{age(now - t.created_at):>5}  {last}"
            )
        )
    return 0


def _ls_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--status", metavar="S[,S...]", help="only tasks of these statuses")
    p.add_argument("--queue", metavar="NAME", help="only tasks of this queue")
    p.add_argument("--limit", type=integer, default=50, metavar="N", help="at most N tasks (50)")
    p.add_argument("--json", action="store_true", help="JSON Lines even on a terminal")


def cmd_gc(args: argparse.Namespace) -> int:
    from ..errors import InputError, OutputFailed
    from ..housekeeping import FINISHED, gc, parse_duration, parse_statuses

    older_than = parse_duration(args.older_than)
    # `is not None`: an empty value (a script's unset variable) is refused, not
    # taken as no filter, which would remove every finished status.
    statuses = parse_statuses(args.status, FINISHED) if args.status is not None else list(FINISHED)
    if not 1 <= args.batch <= 100000:
        raise InputError(f"--batch must be 1-100000, got {args.batch}")
    verb = "would remove" if args.dry_run else "removed"
    # Output that cannot be written (a reader gone, `gc | head`; a full disk)
    # ends the printing, not the gc: raised once every batch and the sweep are done.
    lost: list[Exception] = []

    def progress(batch: list[tuple[str, str]]) -> None:
        if args.json or lost:
            return
        try:
            for task_id, status in batch:
                out(printable(f"{verb} {task_id} ({status})"))
            flush()
        except (BrokenPipeError, OutputFailed) as exc:
            lost.append(exc)

    store: Any = open_existing(args, write=not args.dry_run)
    try:
        report = gc(store, older_than=older_than, statuses=statuses, dry_run=args.dry_run,
                    batch=args.batch, progress=progress)  # fmt: skip
    finally:
        store.close()
    if lost:
        raise lost[0]
    if args.json:
        out(json_line(report.as_json()))
        return 0
    for name in report.blobs:
        out(printable(f"{verb} blob {name}"))
    for name in report.temps:
        out(printable(f"{verb} temporary blob file {name}"))
    rows = "" if args.dry_run else f", {report.steps} step(s), {report.events} event(s)"
    held = f"; {report.skipped} left (held or changed meanwhile)" if report.skipped else ""
    out(f"gc: {verb} {len(report.removed)} task(s){rows}, {len(report.blobs)} blob(s){held}")
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
        "--batch", type=integer, default=500, metavar="N", help="tasks per transaction (500)"
    )
    p.add_argument("--json", action="store_true", help="one JSON object: counts and tasks")


def cmd_doctor(args: argparse.Namespace) -> int:
    from ..errors import VerificationFailed
    from ..housekeeping import doctor
    from ..settings import Settings

    store: Any = open_existing(args, write=args.fix)
    try:
        findings, fixed = doctor(store, artifacts=Settings.from_env().artifacts, fix=args.fix)
    finally:
        store.close()
    if args.json:
        out(json_line({
            "ok": not findings, "findings": [f.as_json() for f in findings],
            "fixed": [f.as_json() for f in fixed],
        }))  # fmt: skip
    else:
        for f in fixed:
            out(printable(f"fixed {f.kind}: {f.subject}: {f.detail}"))
        for f in findings:
            out(printable(f.line()))
        out(f"doctor: {len(findings)} finding(s)" if findings else "doctor: no findings")
    if findings:
        flush()
        raise VerificationFailed(f"doctor found {len(findings)} problem(s)")
    return 0


def _doctor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fix", action="store_true", help="repair what can be repaired safely")
    p.add_argument("--json", action="store_true", help="one JSON object: findings and fixes")


def cmd_ui(args: argparse.Namespace) -> int:
    import sys

    from .webui import LOOPBACK, serve

    def open_store() -> Any:
        return open_existing(args, write=False)

    open_store().close()  # a database that is not there is an error now, not per page
    server = serve(
        args.db, open_store, host=args.host, port=args.port, allow_remote=args.allow_remote
    )
    host, port = str(server.server_address[0]), int(server.server_address[1])
    shown = f"[{host}]" if ":" in host else host
    if args.host not in LOOPBACK:
        say(f"WARNING: serving {args.host}:{port} to other machines, without authentication")
    out(f"serving http://{shown}:{port}/ (read-only; Ctrl-C stops)")
    flush()
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
    p.add_argument(
        "--port", type=integer, default=8765, help="port (default 8765; 0: any free port)"
    )
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a --host other than loopback (the view has no authentication)",
    )


#: The commands of this module, in the order ``--help`` lists them.
COMMANDS = {
    "report": Command(
        cmd_report,
        "write the task's history as one self-contained HTML page: a lane per run, a bar per "
        "attempt, kills, recoveries, artifacts and the journal",
        _report_args, "ninelives report demo -o demo.html   # then open demo.html",
    ),
    "ls": Command(
        cmd_ls, "list tasks, newest first: status, steps done, attempts, age", _ls_args,
        "ninelives ls --status failed,blocked --limit 20",
    ),
    "gc": Command(
        cmd_gc, "delete finished tasks older than a duration, with their journal", _gc_args,
        "ninelives gc --older-than 30d --dry-run",
    ),
    "doctor": Command(
        cmd_doctor, "check the database and its folders; exit 7 on findings", _doctor_args,
        "ninelives doctor   # then doctor --fix for what it can repair",
    ),
    "ui": Command(
        cmd_ui,
        "serve a read-only web view of the tasks on 127.0.0.1: list, timelines, fleet, /metrics",
        _ui_args, "ninelives ui --port 8765   # then open http://127.0.0.1:8765/",
    ),
}  # fmt: skip
