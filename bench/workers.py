"""Throughput of worker fleets on PostgreSQL against SQLite, and the per-step cost.

    .venv/bin/python bench/workers.py [--tasks 200] [--steps 400]

Measured in one run, on one machine, with the same plan (the guide's three
steps: fetch, summarize, write_artifact) for every configuration:

* tasks/s of ``ninelives worker --drain`` with 1, 2 and 4 worker processes on
  one PostgreSQL database, against one worker process on SQLite (WAL,
  synchronous=FULL): from the start of the processes to the last one's exit;
* the per-step cost on PostgreSQL (``start_step`` + ``finish_step``: two
  fenced commits with their journal rows, lease renewal included) against two
  raw PostgreSQL commits of one row each on the same server.

The server is a cluster of our own with PostgreSQL's durable defaults (fsync
and synchronous_commit on), unless ``NINELIVES_BENCH_PG_URL`` names one.
Prints a Markdown table with the ratios.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PLAN = {
    "goal": "Summarize notes into a report",
    "steps": [
        {"tool": "fetch", "input": {"path": "input/notes.txt"}},
        {"tool": "summarize", "input": {"from": 0}},
        {"tool": "write_artifact", "input": {"from": 1}},
    ],
}
NOTES = "Line one\n\n  Line two  \nLine three\nLine four\n"


def _pgcluster() -> Any:
    spec = importlib.util.spec_from_file_location("pgcluster", ROOT / "tests" / "pgcluster.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cli() -> list[str]:
    script = Path(sys.executable).with_name("ninelives")
    return [str(script)] if script.exists() else [sys.executable, "-m", "ninelives"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "NINELIVES_"))}
    return env


def _folder(tasks: int, db: str) -> Path:
    """A scratch folder with the notes, and ``tasks`` tasks submitted to ``db``."""
    import ninelives
    from ninelives.plan import plan_from_dict

    folder = Path(tempfile.mkdtemp(prefix="ninelives-bench-"))
    (folder / "input").mkdir()
    (folder / "input" / "notes.txt").write_text(NOTES, encoding="utf-8")
    url = db if "://" in db else str(folder / db)
    plan = plan_from_dict(PLAN)
    with ninelives.open(url) as rt:
        for i in range(tasks):
            rt.create(f"t{i:04d}", plan, queue="bench")
    return folder


def _window(url: str) -> float:
    """Seconds from the first claim to the last ``task_done``, by the journal's clock."""
    query = (
        "SELECT min(ts) FILTER (WHERE kind = 'run_started'), "
        "max(ts) FILTER (WHERE kind = 'task_done') FROM events"
    )
    if "://" in url:
        import psycopg

        with psycopg.connect(url) as conn:
            row = conn.execute(query).fetchone()
    else:
        import sqlite3

        with sqlite3.connect(url) as conn:
            row = conn.execute(query).fetchone()
    assert row is not None
    return float(row[1] - row[0])


def fleet_rate(db: str, workers: int, tasks: int) -> tuple[float, float]:
    """tasks/s of ``workers`` processes draining ``tasks`` tasks from ``db``: over
    the whole run (process start-up included) and while they worked."""
    folder = _folder(tasks, db)
    try:
        argv = [*_cli(), "--db", db, "worker", "--queue", "bench", "--drain", "-q"]
        argv += ["--poll", "0.02"]
        start = time.perf_counter()
        procs = [
            subprocess.Popen(argv, cwd=folder, env=_env(), stderr=subprocess.DEVNULL)
            for _ in range(workers)
        ]
        codes = [p.wait() for p in procs]
        elapsed = time.perf_counter() - start
        if codes != [0] * workers:
            raise SystemExit(f"workers exited {codes}")
        done = len(list((folder / "artifacts").glob("*.md")))
        if done != tasks:
            raise SystemExit(f"{done} artifacts for {tasks} tasks")
        window = _window(db if "://" in db else str(folder / db))
        return tasks / elapsed, tasks / window
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def step_cost(url: str, steps: int) -> tuple[float, float]:
    """Median seconds of one step (two fenced commits) and of two raw commits."""
    import psycopg

    import ninelives
    from ninelives.plan import plan_from_dict

    plan = plan_from_dict(
        {"goal": "steps", "steps": [{"tool": "fetch", "input": {"path": "x"}}] * steps}
    )
    with ninelives.open(url) as rt:
        rt.create("steps", plan)
        store = rt.store
        run, _ = store.begin_run("steps", "bench")
        ours = []
        for idx in range(steps):
            t0 = time.perf_counter()
            store.start_step(run, idx, "fetch")
            store.finish_step(run, idx, "fetch", '{"ok":true}', last=idx == steps - 1)
            ours.append(time.perf_counter() - t0)
        store.end_run(run)
    raw = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE raw_bench (id serial PRIMARY KEY, status text, data text)")
        conn.execute("INSERT INTO raw_bench (status, data) VALUES ('pending', '{}')")
        for _ in range(steps):
            t0 = time.perf_counter()
            conn.execute("UPDATE raw_bench SET status = 'running' WHERE id = 1")
            conn.execute(
                "UPDATE raw_bench SET status = 'done', data = '{\"ok\":true}' WHERE id = 1"
            )
            raw.append(time.perf_counter() - t0)
    return statistics.median(ours), statistics.median(raw)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=200, help="tasks per configuration (200)")
    parser.add_argument("--steps", type=int, default=400, help="steps timed for the cost (400)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each row is a median (3)")
    args = parser.parse_args()

    url = os.environ.get("NINELIVES_BENCH_PG_URL")
    pg = _pgcluster()
    server = pg.PgServer(url) if url else pg.PgCluster(durable=True).start()
    try:
        # Rounds interleave the configurations, so a change of load on the
        # machine during the run touches every row alike; each row is a median.
        rows = ["SQLite, 1 worker process"] + [f"PostgreSQL, {n} worker(s)" for n in (1, 2, 4)]
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}
        costs: list[tuple[float, float]] = []
        for _ in range(args.repeat):
            samples[rows[0]].append(fleet_rate("state.db", 1, args.tasks))
            for name, workers in zip(rows[1:], (1, 2, 4), strict=True):
                db = server.url(server.create_database("bench"))
                samples[name].append(fleet_rate(db, workers, args.tasks))
            costs.append(step_cost(server.url(server.create_database("bench")), args.steps))
        results = [
            (
                name,
                (
                    statistics.median(w for w, _ in samples[name]),
                    statistics.median(k for _, k in samples[name]),
                ),
            )
            for name in rows
        ]
        sqlite_rate = results[0][1]
        ours = statistics.median(c[0] for c in costs)
        raw = statistics.median(c[1] for c in costs)
    finally:
        server.stop()

    print(
        f"ninelives workers: {args.tasks} tasks of the 3-step guide plan per row, "
        f"median of {args.repeat} interleaved rounds, one run"
    )
    print()
    print("| configuration | tasks/s working | vs SQLite | tasks/s with start-up | vs SQLite |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, (whole, working) in results:
        print(
            f"| {name} | {working:.1f} | {working / sqlite_rate[1]:.2f}x "
            f"| {whole:.1f} | {whole / sqlite_rate[0]:.2f}x |"
        )
    print()
    print("| per step on PostgreSQL | ms | ratio |")
    print("| --- | ---: | ---: |")
    print(f"| ninelives step (2 fenced commits + journal) | {ours * 1e3:.3f} | {ours / raw:.2f}x |")
    print(f"| two raw commits | {raw * 1e3:.3f} | 1.00x |")
    print()
    rates = {name: {"with_start_up": w, "working": k} for name, (w, k) in results}
    print(json.dumps({"rates": rates, "step_s": ours, "raw_two_commits_s": raw}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
