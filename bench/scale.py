"""Does ninelives stay as fast with a big history? Hot operations on a database
holding many finished tasks and their journal, against the same on an empty one.

For each store (SQLite, and PostgreSQL unless ``--no-pg``) the script builds a
"big" database fast (bulk inserts in one transaction, not through the
runtime): ``--tasks`` finished tasks of 3 steps, ``--events`` journal events
among them, plus ``--gc`` more finished a month ago. An "empty" database gets
the same schema. Then, interleaved between the two in ``--rounds`` rounds (the
machine's noise is shared), it times through the library:

* ``run``: create and run a new 3-step task (stub tools, no I/O of their own);
* recovery at start: ``begin_run`` of a task whose step was left running;
* ``status`` and ``export`` of one task; ``ls --limit 20``;
* a worker's claim of the one queued task (the finished ones share its queue);

and finally ``gc`` of the ``--gc`` month-old tasks (once; the empty database
gets the same month-old tasks first, and nothing else). Both also get 20
recent finished tasks, so that ``ls`` lists as many lines in both. Prints medians and the
ratio big / empty for each; the aim is within 1.5x.

    python bench/scale.py [--tasks 100000] [--events 1000000] [--gc 10000]
                          [--rounds 7] [--pg URL | --no-pg]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ninelives
from ninelives.housekeeping import gc
from ninelives.plan import plan_from_dict
from ninelives.settings import Settings
from ninelives.store import open_store
from ninelives.tools import Registry

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from workers import _pgcluster  # noqa: E402

PLAN = {
    "goal": "Summarize notes into a report",
    "steps": [
        {"tool": "fetch", "input": {"path": "input/notes.txt"}},
        {"tool": "summarize", "input": {"from": 0}},
        {"tool": "write_artifact", "input": {"from": 1}},
    ],
}
#: A finished task's journal: created, one run, three steps, done (9 events);
#: a task given more events gets more runs' worth of progress events.
JOURNAL = ["task_created", "run_started"] + ["step_started", "step_finished"] * 3 + ["task_done"]
STATUSES = ["done"] * 18 + ["failed", "cancelled"]
MONTH = 30 * 86400.0
REPEAT = 20
READS = ("status", "export", "ls")


def stub_tools() -> Registry:
    """The plan's three tool names, each returning a small constant output."""
    registry = Registry(entry_points=False)
    registry.register("fetch", lambda i, c, k: {"chars": 5, "sha256": "0" * 64, "text": "hello"})
    registry.register("summarize", lambda i, c, k: {"summary": "hello", "engine": "stub"})
    registry.register("write_artifact", lambda i, c, k: {"path": f"{k}.md", "deduplicated": False})
    return registry


# -- building a big history fast ------------------------------------------------


def history(
    prefix: str, tasks: int, events: int, now: float, age: float
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Rows of ``tasks`` finished tasks (steps, and ``events`` events in all)."""
    task_rows, step_rows, event_rows = [], [], []
    per_task, extra = divmod(events, max(tasks, 1))
    for i in range(tasks):
        task_id = f"{prefix}{i:07d}"
        created = now - age - (tasks - i) * 0.01
        status = STATUSES[i % len(STATUSES)]
        task_rows.append((task_id, "history", status, created, created + 1.0, 1, "default"))
        for idx, tool in enumerate(("fetch", "summarize", "write_artifact")):
            step_rows.append((task_id, idx, tool, "{}", "done", '{"n": 1}', 1))
        count = per_task + (1 if i < extra else 0)
        for n in range(count):
            kind = JOURNAL[n] if n < len(JOURNAL) else "step_progress"
            event_rows.append((created + n * 0.001, task_id, "run0", kind, None, "{}"))
    return task_rows, step_rows, event_rows


TASK_COLUMNS = "id, goal, status, created_at, updated_at, lease_epoch, queue"
STEP_COLUMNS = "task_id, idx, tool, input, status, output, attempts"
EVENT_COLUMNS = "ts, task_id, run_id, kind, step_idx, data"


def fill(url: str, rows: tuple[list[tuple[Any, ...]], ...]) -> None:
    """Insert the rows in one transaction (COPY on PostgreSQL), then refresh statistics."""
    tasks, steps, events = rows
    if url.startswith("postgresql"):
        import psycopg

        with psycopg.connect(url) as conn, conn.cursor() as cur:
            for table, columns, data in (
                ("tasks", TASK_COLUMNS, tasks), ("steps", STEP_COLUMNS, steps),
                ("events", EVENT_COLUMNS, events),
            ):  # fmt: skip
                with cur.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                    for row in data:
                        copy.write_row(row)
            conn.commit()
            conn.autocommit = True
            conn.execute("ANALYZE")
        return
    conn = sqlite3.connect(url, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(f"INSERT INTO tasks ({TASK_COLUMNS}) VALUES (?,?,?,?,?,?,?)", tasks)
        conn.executemany(f"INSERT INTO steps ({STEP_COLUMNS}) VALUES (?,?,?,?,?,?,?)", steps)
        conn.executemany(f"INSERT INTO events ({EVENT_COLUMNS}) VALUES (?,?,?,?,?,?)", events)
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


# -- the operations -------------------------------------------------------------


class Bench:
    """One database and the operations timed on it."""

    def __init__(self, url: str, folder: Path) -> None:
        self.url = url
        settings = Settings(artifacts=str(folder / "artifacts"), workspace=str(folder))
        self.rt = ninelives.open(url, settings=settings, tools=stub_tools())
        self.store: Any = self.rt.store
        self.n = 0
        self.cleanup: list[Callable[[], None]] = []
        self.plan = plan_from_dict(PLAN)

    def _id(self, kind: str) -> str:
        self.n += 1
        return f"{kind}-{self.n}"

    def run(self) -> Callable[[], object]:
        task_id = self._id("run")
        return lambda: (self.rt.create(task_id, self.plan), self.rt.run(task_id))

    def recovery(self) -> Callable[[], object]:
        task_id = self._id("recover")
        self.store.create_task(task_id, self.plan)
        run, _ = self.store.begin_run(task_id, os.urandom(16).hex(), start_first=True)
        self.store.abandon_run(run)  # its runner is gone: step 0 stays running
        self.store.end_run(run)

        def recover() -> None:
            again, _ = self.store.begin_run(task_id, os.urandom(16).hex(), max_recoveries=5)
            assert again.recovered == (0,), again
            self.store.end_run(again)

        return recover

    # Reads take tens of microseconds: each sample is the mean of REPEAT calls.

    def status(self) -> Callable[[], object]:
        return lambda: [self.store.get_task("run-1") for _ in range(REPEAT)]

    def export(self) -> Callable[[], object]:
        return lambda: [self.store.events("run-1") for _ in range(REPEAT)]

    def ls(self) -> Callable[[], object]:
        return lambda: [self.store.list_tasks(limit=20) for _ in range(REPEAT)]

    def claim(self) -> Callable[[], object]:
        task_id = self._id("queued")
        self.store.create_task(task_id, self.plan, queue="default")

        def claim() -> None:
            claimed = self.store.claim_next("default", os.urandom(16).hex())
            assert claimed is not None, task_id
            assert claimed[0].task_id == task_id, claimed
            # Untimed: run it to the end, so the next round's claim finds its own task.
            self.cleanup.append(lambda: self._finish(*claimed))

        return claim

    def _finish(self, run: Any, task: Any) -> None:
        try:
            self.rt.execute(run, task)
        finally:
            self.store.end_run(run)

    def close(self) -> None:
        self.rt.close()


OPERATIONS = ("run", "recovery", "status", "export", "ls", "claim")
LABELS = {
    "run": "`run` of a new 3-step task (create + run)",
    "recovery": "recovery at start (a step left running)",
    "status": "`status` of one task",
    "export": "`export` of one task",
    "ls": "`ls --limit 20`",
    "claim": "a worker's claim",
    "gc": "`gc` of {gc:,} month-old tasks",
}


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(
    backend: str, urls: dict[str, str], folder: Path, args: argparse.Namespace
) -> dict[str, dict[str, float]]:
    """Medians in seconds: ``{operation: {"empty": s, "big": s}}``."""
    now = time.time()
    if backend == "PostgreSQL":
        assert all(url.startswith("postgresql://") for url in urls.values()), urls
    for url in urls.values():
        open_store(url).close()  # the schema, migrated as any first command does
    t0 = time.perf_counter()
    fill(urls["big"], history("h", args.tasks, args.events, now, 3600.0))
    for url in urls.values():  # so that ls lists as many tasks in both
        fill(url, history("recent", 20, 20 * len(JOURNAL), now, 60.0))
    fill(urls["big"], history("old", args.gc, args.gc * len(JOURNAL), now, MONTH))
    print(f"{backend}: built {args.tasks:,} tasks and {args.events:,} events "
          f"(+{args.gc:,} to gc) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)  # fmt: skip
    benches = {}
    for which, url in urls.items():
        (folder / which / "input").mkdir(parents=True, exist_ok=True)
        (folder / which / "input" / "notes.txt").write_text("a\nb\nc\n", encoding="utf-8")
        benches[which] = Bench(url, folder / which)
    samples: dict[str, dict[str, list[float]]] = {op: {"empty": [], "big": []} for op in OPERATIONS}
    try:
        for _ in range(args.rounds):
            for op in OPERATIONS:
                for which in ("empty", "big"):
                    fn = getattr(benches[which], op)()
                    samples[op][which].append(timed(fn))
                    while benches[which].cleanup:
                        benches[which].cleanup.pop()()
        result = {
            op: {w: statistics.median(s) / (REPEAT if op in READS else 1) for w, s in by.items()}
            for op, by in samples.items()
        }
        fill(urls["empty"], history("old", args.gc, args.gc * len(JOURNAL), now, MONTH))
        result["gc"] = {}
        for which in ("empty", "big"):
            store = benches[which].store
            t = time.perf_counter()
            report = gc(store, older_than=MONTH / 2)
            result["gc"][which] = time.perf_counter() - t
            assert len(report.removed) == args.gc, (which, len(report.removed))
    finally:
        for bench in benches.values():
            bench.close()
    return result


def table(results: dict[str, dict[str, dict[str, float]]], args: argparse.Namespace) -> str:
    lines = [
        "| operation | store | empty database | big database | ratio |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for op in (*OPERATIONS, "gc"):
        for backend, result in results.items():
            empty, big = result[op]["empty"], result[op]["big"]
            label = LABELS[op].format(gc=args.gc)
            lines.append(
                f"| {label} | {backend} | {empty * 1000:.2f} ms | {big * 1000:.2f} ms | "
                f"{big / empty:.2f}x |"
            )
    return "\n".join(lines)


@contextlib.contextmanager
def pg_databases(url: str | None) -> Iterator[dict[str, str]]:
    """Two fresh databases on the server at ``url``, or on a durable cluster of our own."""
    pg = _pgcluster()
    server = pg.PgServer(url) if url else pg.PgCluster(durable=True).start()
    try:
        yield {"empty": server.url(server.create_database("scale_empty")),
               "big": server.url(server.create_database("scale_big"))}  # fmt: skip
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--gc", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--pg", metavar="URL", help="a PostgreSQL server (default: our own)")
    parser.add_argument("--no-pg", action="store_true", help="SQLite only")
    args = parser.parse_args(argv)
    results: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="ninelives-scale-") as tmp:
        folder = Path(tmp)
        urls = {w: str(folder / f"{w}.db") for w in ("empty", "big")}
        results["SQLite"] = measure("SQLite", urls, folder / "sqlite", args)
        if not args.no_pg:
            with pg_databases(args.pg) as pg_urls:
                results["PostgreSQL"] = measure("PostgreSQL", pg_urls, folder / "pg", args)
    print(f"{args.tasks:,} finished tasks and {args.events:,} journal events against an "
          f"empty database; medians of {args.rounds} rounds (gc: one run)")  # fmt: skip
    print(table(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
