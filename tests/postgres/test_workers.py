"""Workers with leases and fencing: real worker processes on a real database,
killed with SIGKILL, paused with SIGSTOP, stopped with SIGTERM."""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Iterator

import pytest
from fleet import Fleet, expected_artifacts, has, journal_problems, run_ids

from ninelives.plan import plan_from_dict
from ninelives.testing import Lab
from ninelives.testing.lab import GUIDE_PLAN

pytestmark = pytest.mark.crash

LEASE = "1"
FAST = ("--lease", LEASE, "--heartbeat", "0.3", "--poll", "0.05")


@pytest.fixture
def fleet(lab: Lab) -> Iterator[Fleet]:
    lab.guide_setup()
    fleet = Fleet(lab)
    yield fleet
    fleet.close()


def submit(fleet: Fleet, *task_ids: str) -> None:
    plan = plan_from_dict(GUIDE_PLAN)
    for task_id in task_ids:
        fleet.store.create_task(task_id, plan, queue="default")


@pytest.mark.fsync_on
@pytest.mark.slow
def test_submit_then_a_worker_drains_the_queue(fleet: Fleet) -> None:
    lab = fleet.lab
    assert lab.cli("submit", "a", "plan.json").returncode == 0
    created = lab.cli("create", "b", "plan.json", "--queue", "default")
    assert created.returncode == 0, created.stderr
    assert lab.cli("create", "solo", "plan.json").returncode == 0  # not enqueued
    worker = fleet.start(*FAST, "--drain")
    assert worker.wait(60) == 0, worker.log()
    assert [r["task"] for r in worker.actions("done")] == ["a", "b"]
    assert lab.artifacts() == expected_artifacts("a", "b")
    assert fleet.store.get_task("solo").status.value == "pending"
    for task_id in ("a", "b"):
        assert journal_problems(fleet.events(task_id)) == []


@pytest.mark.fsync_on
@pytest.mark.slow
def test_a_sigkilled_worker_is_taken_over_after_its_lease(fleet: Fleet, backend: str) -> None:
    submit(fleet, "t")
    doomed = fleet.start(*FAST, AGENT_STEP_DELAY="30")
    events = fleet.wait_events("t", has("step_started", 0))
    started = events[-1]
    before = fleet.lab.snapshot("t")
    assert doomed.proc.poll() is None
    doomed.signal(signal.SIGKILL)
    assert doomed.wait() == -signal.SIGKILL
    heir = fleet.start(*FAST)
    events = fleet.wait_events("t", has("task_done"), timeout=60)
    resumed = [e for e in events if e.kind == "run_started"][-1]
    assert resumed.data == {"recovered": [0]}
    if backend != "sqlite":  # on SQLite the dead worker's kernel lock is gone at once
        assert resumed.ts - started.ts >= float(LEASE) - 0.05
    heir.signal(signal.SIGTERM)
    assert heir.wait() == 0
    after = fleet.lab.snapshot("t")
    from ninelives.testing import five_property_violations

    assert (
        five_property_violations(
            plan=GUIDE_PLAN,
            before=before,
            after=after,
            runs=2,
            artifacts=fleet.lab.artifacts(),
            expected_artifacts=expected_artifacts("t"),
        )
        == []
    )
    assert journal_problems(events) == []


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("unsafe", "fencing"),
    [(False, True), (True, True), (True, False)],
    ids=["safe-effect", "unsafe-effect", "negative-control-fencing-off"],
)
def test_a_paused_worker_commits_nothing_after_takeover(
    pg_database: str, tmp_path: object, unsafe: bool, fencing: bool
) -> None:
    """SIGSTOP a worker in step 2 past its lease; another worker finishes the task;
    SIGCONT the first. With fencing it notices, writes nothing and runs no effect.
    With the unsafe (appending) effect, the negative control with fencing switched
    off shows the zombie's effect committed a second time."""
    from pathlib import Path

    lab = Lab(Path(str(tmp_path)) / "lab", db=pg_database)
    lab.guide_setup()
    fleet = Fleet(lab)
    env = {"AGENT_UNSAFE_EFFECTS": "1"} if unsafe else {}
    if not fencing:
        env["NINELIVES_TEST_DISABLE_FENCING"] = "unsafe-test-only:" + pg_database
    try:
        submit(fleet, "t")
        zombie = fleet.start(*FAST, AGENT_STEP_DELAY="1", **env)
        events = fleet.wait_events("t", has("step_started", 2))
        zombie.signal(signal.SIGSTOP)
        paused_at = time.monotonic()
        zombie_run = run_ids(events)[-1]
        heir = fleet.start(*FAST, **env)
        events = fleet.wait_events("t", has("task_done"), timeout=60)
        # taken over only once the lease lapsed: a lease less one heartbeat after the pause
        assert time.monotonic() - paused_at >= float(LEASE) - 0.35
        heir.signal(signal.SIGTERM)
        assert heir.wait() == 0
        done_at = [e.seq for e in events if e.kind == "task_done"]
        zombie.signal(signal.SIGCONT)
        # The zombie wakes in its step delay, then tries to go on with step 2.
        deadline = time.monotonic() + 20
        outcome = ("lease_lost", "store_error")
        while time.monotonic() < deadline and not any(zombie.actions(a) for a in outcome):
            time.sleep(0.05)
        zombie.signal(signal.SIGTERM)
        assert zombie.wait() == 0, zombie.log()
        events = fleet.events("t")
        zombie_events = [e for e in events if e.run_id == zombie_run]
        written_after = [e for e in zombie_events if e.seq > done_at[0]]
        report = (lab.root / "artifacts" / "report.log").read_text() if unsafe else ""
        if fencing:
            assert [r["task"] for r in zombie.actions("lease_lost")] == ["t"], zombie.log()
            assert written_after == []
            assert journal_problems(events) == []
            assert fleet.store.get_task("t").status.value == "done"
            assert [e.kind for e in events].count("task_done") == 1
            if unsafe:
                assert report.count("---") == 1  # the heir's effect only
            else:
                assert lab.artifacts() == expected_artifacts("t")
        else:
            assert "fencing is OFF" in zombie.log()
            assert zombie.actions("lease_lost") == []
            assert report.count("---") == 2, "with fencing off the zombie's effect lands twice"
    finally:
        fleet.close()


@pytest.mark.postgres
@pytest.mark.slow
def test_four_workers_two_hundred_tasks_random_sigkills(pg_database: str, tmp_path: object) -> None:
    from pathlib import Path

    lab = Lab(Path(str(tmp_path)) / "lab", db=pg_database)
    lab.guide_setup()
    fleet = Fleet(lab)
    tasks = [f"t{i:03d}" for i in range(200)]
    rng = random.Random(20240601)
    env = {"AGENT_STEP_DELAY": "0.02"}
    try:
        submit(fleet, *tasks)
        slots = [fleet.start(*FAST, "-q", **env) for _ in range(4)]
        kills = 0
        deadline = time.monotonic() + 100
        while (left := fleet.store.unfinished("default")) and time.monotonic() < deadline:
            time.sleep(rng.uniform(0.05, 0.2))
            # Kills follow progress (one per 14 tasks done), not the clock, so all
            # twelve land mid-run however fast the machine is.
            if kills < 12 and len(tasks) - left >= 14 * (kills + 1):
                i = rng.randrange(len(slots))
                slots[i].signal(signal.SIGKILL)
                assert slots[i].wait() == -signal.SIGKILL
                kills += 1
                slots[i] = fleet.start(*FAST, "-q", **env)
        assert fleet.store.unfinished("default") == 0, "tasks stranded"
        for worker in slots:
            worker.wait_for("started")  # a worker still starting up has no handler yet
            worker.signal(signal.SIGTERM)
        assert [w.wait() for w in slots] == [0, 0, 0, 0]
        assert kills == 12
        problems = {}
        recovered = 0
        for task_id in tasks:
            task = fleet.store.get_task(task_id)
            events = fleet.events(task_id)
            found = journal_problems(events)
            if task.status.value != "done":
                found.append(f"status {task.status.value}")
            if [e.kind for e in events].count("task_done") != 1:
                found.append("not done exactly once")
            recovered += sum(e.kind == "step_recovered" for e in events)
            if found:
                problems[task_id] = found
        assert problems == {}
        assert lab.artifacts() == expected_artifacts(*tasks)
        assert recovered > 0, "no kill landed mid-step: the test proved nothing"
    finally:
        fleet.close()


@pytest.mark.slow
def test_sigterm_finishes_the_step_releases_the_lease_and_exits_0(fleet: Fleet) -> None:
    submit(fleet, "t")
    worker = fleet.start(*FAST, AGENT_STEP_DELAY="1.5")
    fleet.wait_events("t", has("step_started", 0))
    worker.signal(signal.SIGTERM)
    assert worker.wait(20) == 0, worker.log()
    events = fleet.events("t")
    assert [e.kind for e in events][-2:] == ["step_started", "step_finished"]
    assert [r["status"] for r in worker.actions("released")] == ["running"]
    # Released, not expired: another worker takes it at once, with nothing to recover.
    start = time.monotonic()
    heir = fleet.start(*FAST, "--drain")
    assert heir.wait(30) == 0
    events = fleet.events("t")
    assert [e for e in events if e.kind == "run_started"][-1].data == {"recovered": []}
    assert time.monotonic() - start < 10
    assert journal_problems(events) == []
    assert fleet.lab.artifacts() == expected_artifacts("t")


def test_a_second_signal_gives_the_step_up_at_once(fleet: Fleet) -> None:
    submit(fleet, "t")
    worker = fleet.start(*FAST, "--lease", "30", "--heartbeat", "10", AGENT_STEP_DELAY="60")
    fleet.wait_events("t", has("step_started", 0))
    worker.signal(signal.SIGTERM)
    time.sleep(0.3)
    worker.signal(signal.SIGINT)
    assert worker.wait(20) == 0, worker.log()
    assert [r["task"] for r in worker.actions("abandoned")] == ["t"]
    heir = fleet.start(*FAST, "--drain")  # no 30 s lease to wait for
    assert heir.wait(30) == 0, heir.log()
    events = fleet.events("t")
    assert [e for e in events if e.kind == "run_started"][-1].data == {"recovered": [0]}
    assert journal_problems(events) == []


def test_grace_expiry_gives_the_step_up(fleet: Fleet) -> None:
    submit(fleet, "t")
    worker = fleet.start(*FAST, "--grace", "0.5", AGENT_STEP_DELAY="60")
    fleet.wait_events("t", has("step_started", 0))
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(20) == 0
    assert time.monotonic() - started < 10
    assert [r["task"] for r in worker.actions("abandoned")] == ["t"]


@pytest.mark.slow
def test_concurrency_runs_tasks_side_by_side(fleet: Fleet) -> None:
    tasks = [f"c{i}" for i in range(6)]
    submit(fleet, *tasks)
    worker = fleet.start(*FAST, "--concurrency", "3", "--drain", AGENT_STEP_DELAY="0.3")
    assert worker.wait(60) == 0, worker.log()
    done = worker.actions("done")
    assert sorted(r["task"] for r in done) == tasks, worker.log()
    assert len({r["worker"] for r in done}) >= 2  # more than one slot ran tasks
    spans = []
    for task_id in tasks:
        events = fleet.events(task_id)
        assert journal_problems(events) == []
        spans.append((events[1].ts, events[-1].ts))  # run_started .. task_done
    overlapping = any(
        a[0] < b[1] and b[0] < a[1] for i, a in enumerate(spans) for b in spans[i + 1 :]
    )
    assert overlapping, f"no two tasks ran at the same time: {spans}"
    assert fleet.lab.artifacts() == expected_artifacts(*tasks)


def test_group_commit_runs_on_sqlite_and_is_logged_off_on_postgres(
    fleet: Fleet, backend: str
) -> None:
    """``--group-commit`` with 4 slots drains the queue on both backends; only
    SQLite uses it (PostgreSQL shares WAL flushes between connections itself)."""
    submit(fleet, "a", "b", "c", "d")
    worker = fleet.start(*FAST, "--drain", "--concurrency", "4", "--group-commit")
    assert worker.wait(60) == 0, worker.log()
    assert sorted(r["task"] for r in worker.actions("done")) == ["a", "b", "c", "d"]
    started = worker.actions("started")[0]
    if backend == "sqlite":
        assert started.get("group_commit") == "2ms"
        assert worker.actions("group_commit_off") == []
    else:
        assert "group_commit" not in started
        assert worker.actions("group_commit_off")[0]["reason"] == "sqlite_only"
    for task_id in "abcd":
        assert journal_problems(fleet.events(task_id)) == []
