"""The lease heartbeat: what keeps a task with a runner whose step outlasts its lease.

Real worker processes on a real PostgreSQL database. The step (6 s) is three
leases (2 s) long and commits nothing while it runs, so only the heartbeat
can keep the lease; a second worker polls the queue the whole time. The
negative control switches the first worker's heartbeat off (a test-only
switch): the second must take the task while the first is still in its step,
and the first must be fenced.

Also the rule for a lease that expired but that nobody took: its holder may
renew it, since the epoch has not moved (nobody else can have committed or
started a tool under it); once another runner claimed the task it may not.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet import Fleet, Worker, has, journal_problems, run_ids

from ninelives.errors import LeaseLost, TaskBusy
from ninelives.plan import plan_from_dict
from ninelives.testing import Lab

pytestmark = [pytest.mark.postgres, pytest.mark.crash]

LEASE = 2.0
STEP = 6.0  # three leases, with no commit in between
#: The control's step: the second worker is started only once the first is in its
#: step, so it gets a wider margin to start up and claim before that step ends.
CONTROL_STEP = 8.0
FLAGS = ("--lease", str(LEASE), "--heartbeat", "0.5", "--poll", "0.05")
ONE_STEP = {
    "goal": "one long step",
    "steps": [{"tool": "fetch", "input": {"path": "input/notes.txt"}}],
}


@pytest.fixture
def fleet(tmp_path: Path, pg_database: str) -> Iterator[Fleet]:
    lab = Lab(tmp_path / "lab", db=pg_database)
    lab.guide_setup()
    fleet = Fleet(lab)
    yield fleet
    fleet.close()
    lab.reap()


def _two_idle_workers(fleet: Fleet, **env: str) -> list[Worker]:
    """Two workers polling an empty queue; the task is submitted only once both
    are up, so whichever does not claim it competes for it from the first moment."""
    workers = [fleet.start(*FLAGS, AGENT_STEP_DELAY=str(STEP), **env) for _ in range(2)]
    for worker in workers:
        worker.wait_for("started", timeout=60)
    fleet.store.create_task("t", plan_from_dict(ONE_STEP), queue="default")
    return workers


def _stop(workers: list[Worker]) -> None:
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(60) == 0, worker.log()


def test_the_heartbeat_keeps_a_step_longer_than_the_lease(fleet: Fleet) -> None:
    workers = _two_idle_workers(fleet)
    # Done, or taken over (a second run_started): either ends the wait at once.
    events = fleet.wait_events(
        "t", lambda ev: has("task_done")(ev) or has("run_started", count=2)(ev), timeout=90
    )
    _stop(workers)
    [started] = [e for e in events if e.kind == "step_started"]
    [finished] = [e for e in events if e.kind == "step_finished"]
    assert finished.ts - started.ts >= STEP - 0.1  # the step did outlast three leases
    claims = [row for w in workers for row in w.actions("claimed")]
    assert len(claims) == 1, [w.log() for w in workers]  # the other worker never got it
    assert len(run_ids(events)) == 1
    assert [e.kind for e in events].count("step_recovered") == 0
    assert [w.actions("lease_lost") for w in workers] == [[], []]
    assert journal_problems(events) == []


def test_control_without_the_heartbeat_the_other_worker_takes_it(
    fleet: Fleet, pg_database: str
) -> None:
    """The first worker runs without its heartbeat; the second (heartbeat on, no
    step delay) starts once the first is in its step, and must take the task
    over while that step still runs; the first must then be fenced."""
    fleet.store.create_task("t", plan_from_dict(ONE_STEP), queue="default")
    first = fleet.start(
        *FLAGS,
        AGENT_STEP_DELAY=str(CONTROL_STEP),
        NINELIVES_TEST_DISABLE_HEARTBEAT="unsafe-test-only:" + pg_database,
    )
    fleet.wait_events("t", has("step_started", 0), timeout=60)
    second = fleet.start(*FLAGS)
    events = fleet.wait_events("t", has("task_done"), timeout=90)
    # The first wakes from its step after the takeover and must find itself
    # fenced: wait for that (progress), not for a while.
    first.wait_for("lease_lost", timeout=60)
    _stop([first, second])
    events = fleet.events("t")
    assert "heartbeat is OFF" in first.log()
    held, took = run_ids(events)
    assert [row["run"] for row in first.actions("claimed")] == [held]
    assert [row["run"] for row in second.actions("claimed")] == [took]
    assert [e.step_idx for e in events if e.kind == "step_recovered"] == [0]
    taken = next(e for e in events if e.kind == "run_started" and e.run_id == took)
    started = next(e for e in events if e.kind == "step_started" and e.run_id == held)
    assert taken.ts - started.ts < CONTROL_STEP  # taken while the first was still in its step
    assert taken.ts - started.ts >= LEASE - 0.1  # and only once its lease had lapsed
    assert [row["run"] for row in first.actions("lease_lost")] == [held]
    assert {e.run_id for e in events if e.kind in ("step_finished", "task_done")} == {took}
    assert journal_problems(events) == []  # fencing: the first wrote nothing after


# -- an expired lease that nobody took --------------------------------------------


def _expiry(store_url: str, task_id: str) -> tuple[int, bool]:
    """(lease_epoch, whether the lease is still unexpired) on the database's clock."""
    import psycopg

    with psycopg.connect(store_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT lease_epoch, lease_expires_at >= ninelives_now() FROM tasks WHERE id = %s",
            (task_id,),
        ).fetchone()
    assert row is not None
    return int(row[0]), bool(row[1])


def test_an_expired_lease_nobody_took_is_renewed_by_its_holder(pg_database: str) -> None:
    """Decided and documented (docs/guides/postgres-and-workers.md, Leases): expiry
    makes a task claimable, it does not take it away. Until another runner claims
    it (a new epoch), the holder's renewal, commit or check before a tool succeeds
    and extends the lease: nothing can have been committed or started under another epoch."""
    from ninelives.store.postgres.store import PostgresStore

    lease = 0.6
    holder = PostgresStore(pg_database, lease=lease, heartbeat=3600)  # never beats
    other = PostgresStore(pg_database, lease=lease)
    try:
        holder.create_task("t", plan_from_dict(ONE_STEP), queue="q")
        run, _ = holder.begin_run("t", "holder")
        holder.start_step(run, 0, "fetch")
        deadline = time.monotonic() + 30
        while _expiry(pg_database, "t")[1]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        holder.check_lease(run)  # renews: nobody took it
        assert _expiry(pg_database, "t") == (run.epoch, True)
        with pytest.raises(TaskBusy):
            other.begin_run("t", "other")
        assert other.claim_next("q", "other") is None
        holder.finish_step(run, 0, "fetch", "{}", last=True)
        holder.end_run(run)
        assert holder.get_task("t").status.value == "done"
    finally:
        holder.close()
        other.close()


def test_an_expired_lease_another_runner_took_is_not_renewed(pg_database: str) -> None:
    from ninelives.store.postgres.store import PostgresStore

    lease = 0.6
    holder = PostgresStore(pg_database, lease=lease, heartbeat=3600)
    other = PostgresStore(pg_database, lease=lease)
    try:
        holder.create_task("t", plan_from_dict(ONE_STEP), queue="q")
        run, _ = holder.begin_run("t", "holder")
        holder.start_step(run, 0, "fetch")
        deadline = time.monotonic() + 30
        while (claimed := other.claim_next("q", "other")) is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert claimed[0].epoch == run.epoch + 1
        with pytest.raises(LeaseLost):
            holder.check_lease(run)
        assert _expiry(pg_database, "t") == (run.epoch + 1, True)
        other.end_run(claimed[0])
    finally:
        holder.close()
        other.close()


def test_a_session_timeout_shorter_than_the_heartbeat_does_not_lapse_the_lease(
    fleet: Fleet, pg_database: str
) -> None:
    """The server ends sessions idle for 1 s (``idle_session_timeout``, as a managed
    server may), and the heartbeat beats every 2 s of a 3 s lease: each beat finds
    its session ended. It must renew on a new session then, not fail and reconnect
    only at the next beat (one renewal in 4 s: the lease lapsed under a live
    holder, the second worker took the task and ran its effect alongside)."""
    sep = "&" if "?" in pg_database else "?"
    url = f"{pg_database}{sep}options=-c%20idle_session_timeout%3D1000"
    flags = ("--lease", "3", "--heartbeat", "2", "--poll", "0.05")
    workers = [fleet.start(*flags, db=url, AGENT_STEP_DELAY="8") for _ in range(2)]
    for worker in workers:
        worker.wait_for("started", timeout=60)
    fleet.store.create_task("t", plan_from_dict(ONE_STEP), queue="default")
    events = fleet.wait_events(
        "t", lambda ev: has("task_done")(ev) or has("run_started", count=2)(ev), timeout=90
    )
    _stop(workers)
    claims = [row for w in workers for row in w.actions("claimed")]
    assert len(claims) == 1, [w.log() for w in workers]
    assert len(run_ids(events)) == 1
    assert [w.actions("lease_lost") for w in workers] == [[], []]
    assert journal_problems(fleet.events("t")) == []
