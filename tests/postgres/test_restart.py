"""A live lease is honoured whatever happened to its holder's sessions.

``run`` may take a task over before its lease expires only when the holder is
provably gone: its session advisory lock is free *and* was taken since the
server's current life began. A server restart frees every session lock, live
holders' included; a terminated or cut main session frees the holder's main
lock while its process lives and its heartbeat renews. In both, ``run`` must
answer 3 instead of running the tool a second time alongside the holder.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet import Fleet, expected_artifacts, has, journal_problems

from ninelives.plan import plan_from_dict
from ninelives.testing import Lab
from ninelives.testing.lab import GUIDE_PLAN
from pgcluster import PgCluster, running_cluster

pytestmark = [pytest.mark.postgres, pytest.mark.crash, pytest.mark.slow]

STEP = "8"  # seconds each step sleeps: outlasts a restart and a `run` attempt


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    with running_cluster() as own:
        yield own


@pytest.fixture
def fleet(tmp_path: Path, cluster: PgCluster) -> Iterator[Fleet]:
    name = cluster.create_database()
    lab = Lab(tmp_path / "lab", db=cluster.url(name))
    lab.guide_setup()
    fleet = Fleet(lab)
    fleet.store.create_task("t", plan_from_dict(GUIDE_PLAN), queue="default")
    yield fleet
    fleet.close()
    lab.reap()
    cluster.drop_database(name)


def fresh(fleet: Fleet) -> None:
    """Forget the test's own store connection (after a restart it is dead)."""
    if fleet._store is not None:
        fleet._store.close()
        fleet._store = None


def query(cluster: PgCluster, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    return list(cluster._conn().execute(sql, params).fetchall())  # type: ignore[attr-defined]


def advisory_locks(cluster: PgCluster, db: str) -> int:
    rows = query(
        cluster,
        "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
        "WHERE l.locktype = 'advisory' AND d.datname = %s",
        db,
    )
    return int(rows[0][0])


def finish(fleet: Fleet) -> None:
    """The holder finishes the task: exactly one artifact, a sound journal, no
    run_started by anyone but the worker."""
    events = fleet.wait_events("t", has("task_done"), timeout=180)
    assert journal_problems(events) == []
    assert fleet.lab.artifacts() == expected_artifacts("t")


def test_run_honours_a_live_lease_after_a_server_restart(fleet: Fleet, cluster: PgCluster) -> None:
    db = fleet.lab.db.rsplit("/", 1)[1]
    worker = fleet.start("--lease", "60", "--poll", "0.05", AGENT_STEP_DELAY=STEP)
    fleet.wait_events("t", has("step_started", 0))
    fresh(fleet)
    cluster.restart()
    # The restart freed the holder's advisory lock: on its own it says "holder gone".
    assert advisory_locks(cluster, db) == 0
    busy = fleet.lab.cli("run", "t", AGENT_STEP_DELAY=STEP)
    assert busy.returncode == 3, busy
    assert "restarted" in busy.stderr
    assert busy.stderr.count("\n") == 1
    finish(fleet)
    runs = {e.run_id for e in fleet.events("t") if e.kind == "run_started"}
    assert all(r["run"] in runs for r in worker.actions("claimed"))
    assert len(runs) == len(worker.actions("claimed"))  # no run_started from `run`


def test_run_honours_a_live_lease_whose_main_session_was_terminated(
    fleet: Fleet, cluster: PgCluster
) -> None:
    db = fleet.lab.db.rsplit("/", 1)[1]
    fresh(fleet)
    worker = fleet.start("--lease", "20", "--heartbeat", "1", AGENT_STEP_DELAY=STEP)
    fleet.wait_events("t", has("step_started", 0))
    fresh(fleet)

    first = _expiry(cluster, fleet)
    deadline = time.monotonic() + 60
    while _expiry(cluster, fleet) == first:  # until the heartbeat has renewed once
        assert time.monotonic() < deadline, worker.log()
        time.sleep(0.05)
    sessions = query(
        cluster,
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name = 'ninelives' "
        "ORDER BY backend_start",
        db,
    )
    main = sessions[0][0]  # the worker's first connection: its slot's store
    query(cluster, "SELECT pg_terminate_backend(%s)", main)
    busy = fleet.lab.cli("run", "t", AGENT_STEP_DELAY=STEP)
    assert busy.returncode == 3, busy
    assert "live process" in busy.stderr
    fresh(fleet)
    finish(fleet)
    assert len([e for e in fleet.events("t") if e.kind == "run_started"]) == len(
        worker.actions("claimed")
    )


def _expiry(cluster: PgCluster, fleet: Fleet) -> float:
    db = fleet.lab.db.rsplit("/", 1)[1]
    import psycopg

    with psycopg.connect(cluster.url(db), autocommit=True) as conn:
        row = conn.execute("SELECT lease_expires_at FROM tasks WHERE id = 't'").fetchone()
    return float(row[0]) if row and row[0] is not None else 0.0


SLOW_TOOL = """
import time

from ninelives.tools import tool


@tool("slow_effect")
def slow_effect(step_input, ctx, idem_key):
    with open("effects.log", "a", encoding="utf-8") as log:
        log.write(idem_key + "\\n")
    time.sleep(step_input["seconds"])
    return {"key": idem_key}
"""


@pytest.mark.parametrize("delay", ["0", "5"])
def test_a_restart_under_a_step_neither_stops_the_run_nor_repeats_the_effect(
    fleet: Fleet, cluster: PgCluster, delay: str
) -> None:
    """A restart while the tool runs (``delay`` 0), or while the run waits before
    it (5), ends the run's idle session. Its next statement (the done commit, the
    lease check) has not left yet and the lease is still its own, so it goes on a
    new session: the run finishes, and the effect happened once, not twice."""
    lab = fleet.lab
    lab.write("slowtools.py", SLOW_TOOL)
    lab.write_plan({"goal": "slow", "steps": [{"tool": "slow_effect", "input": {"seconds": 5}}]})
    assert lab.cli("--tools", "slowtools", "create", "s", "plan.json").returncode == 0
    run = lab.spawn("--tools", "slowtools", "run", "s", AGENT_STEP_DELAY=delay)
    fresh(fleet)
    fleet.wait_events("s", has("step_started", 0), timeout=60)
    fresh(fleet)
    cluster.restart()
    _, err = run.communicate(timeout=120)
    fresh(fleet)
    assert (run.returncode, err.count("ninelives: error")) == (0, 0), err
    kinds = [e.kind for e in fleet.events("s")]
    assert (kinds.count("step_started"), kinds.count("step_recovered")) == (1, 0), kinds
    assert kinds[-1] == "task_done"
    effects = (lab.root / "effects.log").read_text(encoding="utf-8").split()
    assert effects == ["s-0"]
