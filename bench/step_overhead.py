"""Per-step overhead of ninelives against the physical floor, and CLI cold start.

The floor of this design is two SQLite commits per step (``running`` before
the tool, ``done`` after), so the script times, in one run and interleaved in
rounds to share the machine's noise:

* N tasks of the guide's 3-step plan through the library API with stub tools
  (no I/O of their own), create and run;
* the same number of bare ``BEGIN IMMEDIATE; INSERT; COMMIT`` transactions on a
  WAL / synchronous=FULL file in the same folder;

and prints the per-step cost and its ratio to two raw commits (medians over
rounds). Then it times ``ninelives status`` on a small database against
``python -c "import sqlite3"`` (the bare interpreter with sqlite3).

    python bench/step_overhead.py [--tasks 300] [--rounds 5] [--starts 20]
"""

from __future__ import annotations

import argparse
import compileall
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ninelives
from ninelives.settings import Settings
from ninelives.tools import Registry

PLAN = {
    "goal": "Summarize notes into a report",
    "steps": [
        {"tool": "fetch", "input": {"path": "input/notes.txt"}},
        {"tool": "summarize", "input": {"from": 0}},
        {"tool": "write_artifact", "input": {"from": 1}},
    ],
}


def stub_tools() -> Registry:
    """The plan's three tool names, each returning a small constant output."""
    registry = Registry(entry_points=False)
    registry.register("fetch", lambda i, c, k: {"chars": 5, "sha256": "0" * 64, "text": "hello"})
    registry.register("summarize", lambda i, c, k: {"summary": "hello", "engine": "stub"})
    registry.register("write_artifact", lambda i, c, k: {"path": f"{k}.md", "deduplicated": False})
    return registry


def time_ninelives(
    folder: Path, tasks: int, start: int, db: str | None = None
) -> tuple[float, float]:
    """Seconds to create and to run ``tasks`` tasks (3 steps each), in ``db`` (a
    PostgreSQL URL) or else in ``folder``'s ``state.db``."""
    settings = Settings(artifacts=str(folder / "artifacts"))
    with ninelives.open(
        db or str(folder / "state.db"), settings=settings, tools=stub_tools()
    ) as rt:
        ids = [f"t{start + i}" for i in range(tasks)]
        t0 = time.perf_counter()
        for task_id in ids:
            rt.create(task_id, PLAN)
        t1 = time.perf_counter()
        for task_id in ids:
            rt.run(task_id)
        t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def time_raw_commits(folder: Path, commits: int) -> float:
    """Seconds for ``commits`` bare write transactions on WAL + synchronous=FULL."""
    conn = sqlite3.connect(folder / "raw.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT)")
    t0 = time.perf_counter()
    for i in range(commits):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (v) VALUES (?)", (f"row {i}",))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    conn.close()
    return elapsed


def cold_start(folder: Path, starts: int) -> tuple[float, float]:
    """Median seconds of ``ninelives status`` and of ``python -c 'import sqlite3'``."""
    # Bytecode as an installed wheel has it: an editable install (or
    # PYTHONDONTWRITEBYTECODE) would otherwise compile every module at each start.
    compileall.compile_dir(os.path.dirname(ninelives.__file__), quiet=1)
    db = str(folder / "small.db")
    with ninelives.open(db, settings=Settings(), tools=stub_tools()) as rt:
        rt.create("demo", PLAN)
    cli = [sys.executable, "-m", "ninelives", "--db", db, "status", "demo", "--json"]
    script = Path(sys.executable).with_name("ninelives")
    if script.exists():
        cli = [str(script), "--db", db, "status", "demo", "--json"]
    bare = [sys.executable, "-c", "import sqlite3"]
    ours, base = [], []
    for _ in range(starts):
        for argv, sink in ((cli, ours), (bare, base)):
            t0 = time.perf_counter()
            subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
            sink.append(time.perf_counter() - t0)
    return statistics.median(ours), statistics.median(base)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=300, help="tasks in all (default 300)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--starts", type=int, default=20, help="cold starts timed (default 20)")
    parser.add_argument("--dir", help="folder for the databases (default: a temp dir here)")
    args = parser.parse_args()
    per_round = max(1, args.tasks // args.rounds)
    steps = 3 * per_round
    with tempfile.TemporaryDirectory(dir=args.dir or os.getcwd()) as tmp:
        folder = Path(tmp)
        step_all, step_run, floor = [], [], []
        for r in range(args.rounds):
            create_s, run_s = time_ninelives(folder, per_round, r * per_round)
            raw_s = time_raw_commits(folder, 2 * steps)
            step_all.append((create_s + run_s) / steps)
            step_run.append(run_s / steps)
            floor.append(raw_s / steps)  # two raw commits per step
        ours, base = cold_start(folder, args.starts)
    med_all, med_run, med_floor = (statistics.median(x) for x in (step_all, step_run, floor))
    print(f"tasks: {per_round * args.rounds} x 3 steps, {args.rounds} rounds (medians)")
    print(f"two raw commits (WAL, synchronous=FULL): {med_floor * 1e3:8.3f} ms")
    print(f"ninelives per step, run only:            {med_run * 1e3:8.3f} ms")
    print(f"ninelives per step, create + run:        {med_all * 1e3:8.3f} ms")
    print(f"per-step ratio to two raw commits (run only):     {med_run / med_floor:5.2f}x")
    print(f"per-step ratio to two raw commits (create + run): {med_all / med_floor:5.2f}x")
    print(f"cold start: ninelives status {ours * 1e3:.1f} ms, python+sqlite3 {base * 1e3:.1f} ms")
    print(f"cold start ratio: {ours / base:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
