"""SQL statements and commits per task: ninelives beside the guide's minimal design.

The guide's 3-step task (``peers.py``'s ``peertools``) runs ``--tasks`` times in a
fresh interpreter and folder per system, with every SQLite connection traced
(``sqlite3.Connection.set_trace_callback``): per task, create and run together,
set-up excluded, the table counts every statement the trace sees (``all``:
``BEGIN`` and ``COMMIT`` included, each row of an ``executemany`` once), the
statements that read or write rows (``data``: all but ``BEGIN``, ``COMMIT``,
``ROLLBACK``, ``SAVEPOINT``, ``RELEASE`` and ``PRAGMA``) and the ``COMMIT``s.
A named query loaded from a ``.sql`` resource starts with its comment lines:
they are dropped from the statement's shape, never from the count. (The schema
has no triggers; a trigger's statements would be reported again by the trace.)
``--top N`` lists each system's N most frequent statements, so every one can be
given its reason. Counts, not times: the figure is the same on a busy machine.

    python bench/statements.py [--tasks 50] [--systems minimal,ninelives] [--top 0] [--json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SYSTEMS = ("minimal", "ninelives", "ninelives-workflow")
#: Statements that move no row: transaction control and settings.
CONTROL = ("BEGIN", "COMMIT", "END", "ROLLBACK", "SAVEPOINT", "RELEASE", "PRAGMA")


def shape(statement: str) -> str:
    """One row per statement shape: leading comment lines dropped, literals and
    whitespace folded."""
    lines = statement.strip().splitlines()
    while lines and lines[0].lstrip().startswith("--"):
        lines.pop(0)
    text = " ".join(lines)
    return re.sub(r"\s+", " ", re.sub(r"'[^']*'|\b\d+\b", "?", text)).strip()


def traced_child(system: str, n: int) -> dict[str, Any]:
    """Run ``n`` tasks of ``system`` here with every SQLite statement counted."""
    import sqlite3

    seen: collections.Counter[str] = collections.Counter()
    counting = [False]
    connect = sqlite3.connect

    def count(statement: str) -> None:
        if counting[0]:
            seen[shape(statement)] += 1

    def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(*args, **kwargs)
        conn.set_trace_callback(count)
        return conn

    # Before ninelives is imported: the store binds sqlite3.connect as a default.
    sqlite3.connect = traced  # type: ignore[assignment]
    sys.path.insert(0, str(HERE))
    import peers
    import peertools

    os.makedirs("input", exist_ok=True)
    os.makedirs(peertools.ARTIFACTS, exist_ok=True)
    Path(peertools.INPUT).write_text(peertools.NOTES)
    work, check = peers.RUNNERS[system](n)
    counting[0] = True
    work()
    counting[0] = False
    done = check()
    if done.get("tasks_done") != n:
        raise SystemExit(f"{system}: {done} after {n} tasks")
    total = sum(seen.values())
    commits = sum(c for s, c in seen.items() if s.upper().startswith(("COMMIT", "END")))
    data = sum(c for s, c in seen.items() if not s.upper().startswith(CONTROL))
    return {
        "system": system,
        "tasks": n,
        "statements_per_task": total / n,
        "data_per_task": data / n,
        "commits_per_task": commits / n,
        "top": [[s, c / n] for s, c in seen.most_common()],
    }


def measure(system: str, n: int) -> dict[str, Any]:
    """One child process, in a fresh folder, for ``system``."""
    with tempfile.TemporaryDirectory(prefix=f"stmts-{system}-") as folder:
        proc = subprocess.run(
            [sys.executable, __file__, "--child", system, "--tasks", str(n)],
            cwd=folder,
            capture_output=True,
            text=True,
            check=False,
        )
    if proc.returncode != 0:
        raise SystemExit(f"{system} failed: {proc.stderr.strip().splitlines()[-1:]}")
    result: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--top", type=int, default=0, help="list each system's N commonest")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(traced_child(args.child, args.tasks)))
        return 0
    results = [measure(s, args.tasks) for s in args.systems.split(",")]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    floor = next((r for r in results if r["system"] == "minimal"), None)
    head = f"{'system':<20} {'all/task':>9} {'data/task':>10} {'commits/task':>13}"
    print(f"{head} {'vs minimal':>11}")
    for r in results:
        ratio = f"{r['statements_per_task'] / floor['statements_per_task']:.2f}x" if floor else "-"
        print(
            f"{r['system']:<20} {r['statements_per_task']:>9.1f} {r['data_per_task']:>10.1f} "
            f"{r['commits_per_task']:>13.1f} {ratio:>11}"
        )
        for statement, per_task in r["top"][: args.top]:
            print(f"    {per_task:5.1f}  {statement[:110]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
