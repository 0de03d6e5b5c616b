"""Group commit: tasks/s of one worker with 1, 4, 16 and 64 slots, with and without it.

    .venv/bin/python bench/group_commit.py [--tasks 256] [--repeat 3] [--no-postgres]

Every configuration drains the same number of tasks of one plan (fetch a
file, summarize it twice: three steps, no artifact, so the commits are the
cost) with one ``ninelives worker --drain --concurrency N`` process, with
``--group-commit`` or without, on a fresh SQLite file (WAL,
``synchronous=FULL``) and on a fresh PostgreSQL database (a throwaway cluster
of our own with PostgreSQL's durable defaults, unless
``NINELIVES_BENCH_PG_URL`` names a server; ``--no-postgres`` skips it).
With ``--sync-ms 1`` every fsync of the SQLite runs costs 1 ms more (an
LD_PRELOAD shim, bench/slowsync.c): this VM flushes in ~40 us, which hides
what a batch saves on a disk whose flush costs a millisecond.
On PostgreSQL the worker logs ``group_commit_off``: the rows "with" measure
the same thing as "without", kept to show it.

tasks/s is counted from the first ``run_started`` to the last ``task_done``
in the journal (process start-up left out). Rounds interleave the
configurations; each figure is a median. The headline is the aim of issue 13
item 3: 16 slots with group commit against one slot on the same file.
Prints a Markdown table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workers
from workers import _cli, _env, _folder, _pgcluster, _window

PLAN = {
    "goal": "Summarize notes",
    "steps": [
        {"tool": "fetch", "input": {"path": "input/notes.txt"}},
        {"tool": "summarize", "input": {"from": 0}},
        {"tool": "summarize", "input": {"from": 0}},
    ],
}
SLOTS = (1, 4, 16, 64)
workers.PLAN = PLAN  # the tasks _folder submits: this plan, without the artifact's fsyncs


def slowsync(ms: float) -> dict[str, str]:
    """The environment that makes every fsync cost ``ms`` more (bench/slowsync.c)."""
    if ms <= 0:
        return {}
    lib = Path(tempfile.gettempdir()) / f"ninelives-slowsync-{os.getuid()}.so"
    source = Path(__file__).resolve().parent / "slowsync.c"
    if not lib.exists() or lib.stat().st_mtime < source.stat().st_mtime:
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(lib), str(source), "-ldl"],
                       check=True)  # fmt: skip
    return {"LD_PRELOAD": str(lib), "SLOWSYNC_US": str(int(ms * 1000))}


def rate(db: str, slots: int, group: bool, tasks: int, extra: dict[str, str]) -> float:
    """tasks/s of one worker process with ``slots`` slots draining ``tasks`` tasks."""
    import shutil

    folder = _folder(tasks, db)
    try:
        url = db if "://" in db else str(folder / db)
        argv = [*_cli(), "--db", url, "worker", "--queue", "bench", "--drain", "-q"]
        argv += ["--poll", "0.02", "--concurrency", str(slots)]
        if group:
            argv.append("--group-commit")
        done = subprocess.run(
            argv,
            cwd=folder,
            env={**_env(), **extra},
            stderr=subprocess.PIPE,
            text=True,
            timeout=900,
        )
        if done.returncode != 0:
            raise SystemExit(f"worker exited {done.returncode}: {done.stderr[-2000:]}")
        return tasks / _window(url)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=256, help="tasks per configuration (256)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each row is a median (3)")
    parser.add_argument("--slots", default=",".join(map(str, SLOTS)), help="1,4,16,64")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument("--no-sqlite", action="store_true", help="PostgreSQL only")
    parser.add_argument(
        "--sync-ms", type=float, default=0.0,
        help="SQLite: add this many ms to every fsync (bench/slowsync.c; needs cc)",
    )  # fmt: skip
    args = parser.parse_args()
    slots = [int(n) for n in args.slots.split(",")]

    server = None
    if not args.no_postgres:
        url = os.environ.get("NINELIVES_BENCH_PG_URL")
        pg = _pgcluster()
        server = pg.PgServer(url) if url else pg.PgCluster(durable=True).start()
    configs = [
        (backend, n, group)
        for backend in ([] if args.no_sqlite else ["sqlite"]) + (["postgres"] if server else [])
        for n in slots
        for group in (False, True)
    ]
    samples: dict[tuple[str, int, bool], list[float]] = {c: [] for c in configs}
    started = time.perf_counter()
    try:
        for _ in range(args.repeat):
            for backend, n, group in configs:
                if backend == "sqlite":
                    db = "state.db"
                else:
                    assert server is not None
                    db = server.url(server.create_database("bench"))
                extra = slowsync(args.sync_ms) if backend == "sqlite" else {}
                samples[(backend, n, group)].append(rate(db, n, group, args.tasks, extra))
    finally:
        if server is not None:
            server.stop()
    med = {c: statistics.median(v) for c, v in samples.items()}

    print(
        f"ninelives group commit: {args.tasks} tasks of a 3-step plan per row, one worker "
        f"process, median of {args.repeat} interleaved rounds "
        f"({time.perf_counter() - started:.0f} s in all)"
        + (f"; SQLite fsyncs slowed by {args.sync_ms:g} ms" if args.sync_ms > 0 else "")
    )
    print()
    print("| backend | slots | tasks/s without | tasks/s with | with / without |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for backend in dict.fromkeys(b for b, _, _ in configs):
        for n in slots:
            off, on = med[(backend, n, False)], med[(backend, n, True)]
            print(f"| {backend} | {n} | {off:.1f} | {on:.1f} | {on / off:.2f}x |")
    out: dict[str, Any] = {
        f"{b}/{n}/{'group' if g else 'plain'}": round(v, 2) for (b, n, g), v in med.items()
    }
    if 16 in slots and 1 in slots and not args.no_sqlite:
        aim = med[("sqlite", 16, True)] / med[("sqlite", 1, False)]
        print()
        print(f"16 slots with group commit / one slot without, same SQLite file: {aim:.2f}x")
        out["aim_16_group_vs_1"] = round(aim, 2)
    print()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
