"""Per-step overhead of ninelives on PostgreSQL against two raw PostgreSQL commits.

The floor of the design is two commits per step (``running`` before the tool,
``done`` after), each at least one round trip and one WAL flush. The script
times, in one run and interleaved in rounds to share the machine's noise:

* a step's two transitions through the store (``start_step`` then
  ``finish_step``: two fenced commits and their journal events), the steps of
  one long task, each timed;
* N tasks of the guide's 3-step plan through the library API with stub tools
  (no I/O of their own), create and run, on the same database: "run only"
  includes each run's claim, reads and release, spread over its steps;
* as many pairs of raw commits as steps, on another database of the same
  server over the same kind of connection: an autocommit single-row ``INSERT``
  then an ``UPDATE`` of that row, ``synchronous_commit`` on, each pair timed;

and prints medians (of each step, each pair, each round's mean for the runs)
and the ratios to two raw commits.

The server is ``--pg URL`` (a role that may create databases), or by default a
durable throwaway cluster of our own (``tests/pgcluster.py``: fsync on).

    python bench/pg_step.py [--tasks 150] [--rounds 5] [--pg URL]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import ninelives

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_overhead import stub_tools, time_ninelives
from workers import _pgcluster

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def pg_databases(url: str | None) -> Iterator[tuple[str, str]]:
    """Two fresh databases (ninelives', the raw commits') on the server at ``url``,
    or on a durable cluster of our own."""
    pg = _pgcluster()
    server = pg.PgServer(url) if url else pg.PgCluster(durable=True).start()
    try:
        yield (server.url(server.create_database("pgstep_nl")),
               server.url(server.create_database("pgstep_raw")))  # fmt: skip
    finally:
        server.stop()


def time_transitions(url: str, steps: int, task_id: str) -> list[float]:
    """Seconds of each step's ``start_step`` + ``finish_step``, in one task of ``steps``."""
    from ninelives.plan import plan_from_dict

    plan = plan_from_dict({"goal": "steps", "steps": [{"tool": "fetch", "input": {}}] * steps})
    with ninelives.open(url, tools=stub_tools()) as rt:
        rt.create(task_id, plan)
        store = rt.store
        run, _ = store.begin_run(task_id, "bench")
        times = []
        for idx in range(steps):
            t0 = time.perf_counter()
            store.start_step(run, idx, "fetch")
            store.finish_step(run, idx, "fetch", '{"ok":true}', last=idx == steps - 1)
            times.append(time.perf_counter() - t0)
        store.end_run(run)
    return times


def time_raw_commits(url: str, pairs: int) -> list[float]:
    """Seconds of each pair (an INSERT commit, then an UPDATE commit of that row)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")
        conn.execute("CREATE TABLE IF NOT EXISTS raw (id BIGSERIAL PRIMARY KEY, v TEXT)")
        times = []
        for i in range(pairs):
            t0 = time.perf_counter()
            row = conn.execute("INSERT INTO raw (v) VALUES (%s) RETURNING id", (f"row {i}",))
            key = row.fetchone()
            conn.execute("UPDATE raw SET v = %s WHERE id = %s", (f"done {i}", key[0] if key else 0))
            times.append(time.perf_counter() - t0)
        return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=150, help="tasks in all (default 150)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--pg", metavar="URL", help="a PostgreSQL server (default: our own)")
    parser.add_argument("--dir", help="folder for artifacts (default: a temp dir)")
    args = parser.parse_args(argv)
    per_round = max(1, args.tasks // args.rounds)
    steps = 3 * per_round
    import tempfile

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp, pg_databases(args.pg) as urls:
        nl_url, raw_url = urls
        step_all, step_run, steps_each, pairs_each = [], [], [], []
        for r in range(args.rounds):
            steps_each += time_transitions(nl_url, steps, f"steps{r}")
            create_s, run_s = time_ninelives(Path(tmp), per_round, r * per_round, db=nl_url)
            pairs_each += time_raw_commits(raw_url, steps)
            step_all.append((create_s + run_s) / steps)
            step_run.append(run_s / steps)
    floor = statistics.median(pairs_each)
    step = statistics.median(steps_each)
    med_all, med_run = statistics.median(step_all), statistics.median(step_run)
    print(f"tasks: {per_round * args.rounds} x 3 steps, {args.rounds} rounds; "
          f"{len(steps_each)} steps and raw pairs timed one by one (medians)")  # fmt: skip
    print(f"two raw PostgreSQL commits:               {floor * 1e3:8.3f} ms")
    print(f"a step's transitions (start + finish):    {step * 1e3:8.3f} ms  {step / floor:5.2f}x")
    print(f"ninelives per step, run only:             {med_run * 1e3:8.3f} ms  "
          f"{med_run / floor:5.2f}x")  # fmt: skip
    print(f"ninelives per step, create + run:         {med_all * 1e3:8.3f} ms  "
          f"{med_all / floor:5.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
