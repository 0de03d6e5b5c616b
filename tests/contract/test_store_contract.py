"""The Store contract, run against every backend: Store methods called directly,
on a real SQLite file and a real PostgreSQL database."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ninelives import __version__
from ninelives.errors import LeaseLost, StoreError, TaskBusy, TaskExists, UnknownTask
from ninelives.journal import invariant_violations
from ninelives.locking import lock_folder
from ninelives.models import Run, StepStatus, TaskStatus
from ninelives.plan import plan_from_dict
from ninelives.store import Store, fencing_disabled, is_postgres_url, open_store

#: Short enough that a test waits little for an expiry, long enough for a slow CI.
LEASE = 0.6

Opener = Callable[..., Store]


@pytest.fixture
def url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh database: a SQLite file path or a PostgreSQL URL."""
    if backend == "sqlite":
        return str(tmp_path / "state.db")
    return str(request.getfixturevalue("pg_database"))


@pytest.fixture
def open_(url: str) -> Iterator[Opener]:
    """Open stores on ``url`` (each one is closed at the end of the test).

    ``heartbeat=None`` gives the default (a third of the lease); a huge one
    stands for a runner that stopped renewing (paused, partitioned).
    """
    opened: list[Store] = []

    def opener(*, lease: float = LEASE, heartbeat: float | None = None) -> Store:
        if is_postgres_url(url):
            from ninelives.store.postgres.store import PostgresStore

            store: Store = PostgresStore(url, lease=lease, heartbeat=heartbeat)
        else:
            store = open_store(url)
        opened.append(store)
        return store

    yield opener
    for store in opened:
        store.close()


@pytest.fixture
def store(open_: Opener) -> Store:
    """One store on a fresh database."""
    return open_()


@pytest.fixture
def take_over(backend: str, url: str) -> Callable[[Store, Run], None]:
    """Make ``run`` claimable by another runner the way its backend allows:
    on SQLite its lock file is deleted; on PostgreSQL its lease is left to expire
    (the store that holds it must have been opened with a heartbeat that never beats)."""

    def take(holder: Store, run: Run) -> None:
        if backend == "sqlite":
            shutil.rmtree(lock_folder(os.path.abspath(url)))
        else:
            time.sleep(LEASE * 1.5)

    return take


PLAN = plan_from_dict(
    {
        "goal": "three steps",
        "steps": [
            {"tool": "fetch", "input": {"path": "a.txt"}},
            {"tool": "summarize", "input": {"from": 0}},
            {"tool": "write_artifact", "input": {"from": 1}},
        ],
    }
)
OTHER = plan_from_dict(
    {"goal": "another plan", "steps": [{"tool": "fetch", "input": {"path": "b"}}]}
)
TakeOver = Callable[[Store, Run], None]
NEVER = 3600.0  # a heartbeat that never beats within a test


def kinds(store: Store, task_id: str) -> list[str]:
    return [e.kind for e in store.events(task_id)]


def snapshot(store: Store, task_id: str) -> tuple[object, ...]:
    """Everything stored about a task, to show that a refused write changed nothing."""
    task = store.get_task(task_id)
    return (
        task.status,
        task.lease_epoch,
        tuple((s.status, s.attempts, s.output) for s in task.steps),
        tuple((e.seq, e.kind, e.step_idx, e.run_id) for e in store.events(task_id)),
    )


# -- create, read ----------------------------------------------------------


def test_create_and_get(store: Store) -> None:
    task = store.create_task("t1", PLAN)
    assert task.id == "t1"
    assert task.goal == "three steps"
    assert task.status is TaskStatus.PENDING
    assert [(s.idx, s.tool, s.status, s.attempts) for s in task.steps] == [
        (0, "fetch", StepStatus.PENDING, 0),
        (1, "summarize", StepStatus.PENDING, 0),
        (2, "write_artifact", StepStatus.PENDING, 0),
    ]
    assert task.steps[0].input == {"path": "a.txt"}
    assert store.get_task("t1") == task
    [created] = store.events("t1")
    assert (created.kind, created.step_idx, created.data) == ("task_created", None, {"steps": 3})
    assert created.ts == pytest.approx(time.time(), abs=60)


def test_task_ids_oldest_first(store: Store) -> None:
    for name in ("b", "a", "c"):
        store.create_task(name, OTHER)
    assert store.task_ids() == ["b", "a", "c"]


def test_task_exists_leaves_the_original(store: Store) -> None:
    store.create_task("t1", PLAN)
    before = snapshot(store, "t1")
    with pytest.raises(TaskExists):
        store.create_task("t1", OTHER)
    assert snapshot(store, "t1") == before
    assert store.get_task("t1").goal == "three steps"


def test_task_ids_are_unique_regardless_of_case(store: Store) -> None:
    # "Demo" and "demo" would publish to one artifact name on a
    # case-insensitive file system: the second create is refused.
    store.create_task("Demo", PLAN)
    before = snapshot(store, "Demo")
    for other in ("demo", "DEMO", "dEmO"):
        with pytest.raises(TaskExists, match=r"'Demo'.*regardless of case"):
            store.create_task(other, OTHER)
        with pytest.raises(UnknownTask):
            store.get_task(other)
    assert snapshot(store, "Demo") == before
    assert store.task_ids() == ["Demo"]
    # The control: ids that differ by more than case are distinct tasks.
    store.create_task("Demo2", OTHER)
    store.create_task("demo-2", OTHER)
    assert store.task_ids() == ["Demo", "Demo2", "demo-2"]


def _plan_of_id_lookup(backend: str, url: str) -> str:
    """How the database finds a task by its lower-cased id (the create check)."""
    from ninelives.store import sql

    query = sql.load_queries(backend)["task_id_taken"]
    if backend == "sqlite":
        import sqlite3

        with sqlite3.connect(url) as conn:
            rows = conn.execute("EXPLAIN QUERY PLAN " + query, {"id": "x"}).fetchall()
        return " ".join(str(r[-1]) for r in rows)
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET enable_seqscan = off")  # a tiny table is scanned otherwise
        rows = conn.execute("EXPLAIN " + query, {"id": "x"}).fetchall()
    return " ".join(str(r[0]) for r in rows)


def test_the_case_insensitive_id_check_uses_an_index(open_: Opener, backend: str, url: str) -> None:
    open_().create_task("Demo", PLAN)
    plan = _plan_of_id_lookup(backend, url)
    assert "tasks_id_lower" in plan, plan


_COLUMNS_0006 = (
    ("steps", "policy"),
    ("steps", "progress"),
    ("steps", "not_before"),
    ("tasks", "plan_sha256"),
)


def test_migration_keeps_ids_that_already_differ_only_by_case(
    open_: Opener, backend: str, url: str
) -> None:
    # A database of an earlier version may hold "Demo" and "demo" already: the
    # migration must not fail on it, both stay readable, and a third spelling
    # is refused.
    first = open_()
    first.create_task("Demo", PLAN)
    first.close()
    duplicate = (
        "INSERT INTO tasks (id, goal, status, created_at, updated_at) "
        "VALUES ('demo', 'older', 'pending', 1, 1)"
    )
    if backend == "sqlite":
        import sqlite3

        with sqlite3.connect(url) as conn:
            conn.execute("DROP INDEX tasks_id_lower")
            conn.execute("ALTER TABLE tasks DROP COLUMN artifacts")  # 0005's
            for table, column in _COLUMNS_0006:
                conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
            conn.execute(duplicate)
            conn.execute("PRAGMA user_version = 3")
    else:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DROP INDEX tasks_id_lower")
            conn.execute("ALTER TABLE tasks DROP COLUMN artifacts")  # 0005's
            for table, column in _COLUMNS_0006:
                conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
            conn.execute(duplicate)
            conn.execute("DELETE FROM ninelives_schema WHERE version >= 4")
    store = open_()
    assert sorted(store.task_ids()) == ["Demo", "demo"]
    assert store.get_task("demo").goal == "older"
    with pytest.raises(TaskExists, match="regardless of case"):
        store.create_task("DEMO", OTHER)
    assert "tasks_id_lower" in _plan_of_id_lookup(backend, url)


def test_unknown_task(store: Store) -> None:
    with pytest.raises(UnknownTask):
        store.get_task("nope")
    with pytest.raises(UnknownTask):
        store.begin_run("nope", "r1")
    assert store.events("nope") == []
    assert store.task_ids() == []


# -- a run -----------------------------------------------------------------


def test_a_whole_run_journals_in_order(store: Store) -> None:
    store.create_task("t1", PLAN)
    run, task = store.begin_run("t1", "run-1")
    assert (run.task_id, run.run_id, run.epoch, run.recovered) == ("t1", "run-1", 1, ())
    assert task.status is TaskStatus.RUNNING
    for idx, step in enumerate(PLAN.steps):
        assert store.start_step(run, idx, step.tool) == 1
        assert store.get_task("t1").steps[idx].status is StepStatus.RUNNING
        store.check_lease(run)
        last = idx == len(PLAN.steps) - 1
        store.finish_step(run, idx, step.tool, f'{{"n":{idx}}}', last=last)
    store.end_run(run)
    store.end_run(run)  # idempotent
    task = store.get_task("t1")
    assert task.status is TaskStatus.DONE
    assert [s.output for s in task.steps] == [{"n": 0}, {"n": 1}, {"n": 2}]
    events = store.events("t1")
    assert [e.kind for e in events] == [
        "task_created", "run_started",
        "step_started", "step_finished", "step_started", "step_finished",
        "step_started", "step_finished", "task_done",
    ]  # fmt: skip
    assert [e.seq for e in events] == sorted({e.seq for e in events})
    assert [e.ts for e in events] == sorted(e.ts for e in events)
    assert events[1].data == {"recovered": []}
    # The contract's two keys, and the version that ran the step.
    assert events[2].data == {"tool": "fetch", "attempt": 1, "ninelives": __version__}
    assert {e.run_id for e in events[1:]} == {"run-1"}
    assert invariant_violations(events) == []


def test_finish_task_without_pending_steps(store: Store) -> None:
    store.create_task("t1", OTHER)
    run, _ = store.begin_run("t1", "r1")
    store.start_step(run, 0, "fetch")
    store.finish_step(run, 0, "fetch", "{}", last=False)
    store.finish_task(run)
    store.end_run(run)
    assert store.get_task("t1").status is TaskStatus.DONE
    assert kinds(store, "t1")[-1] == "task_done"


def test_record_error_until_the_attempt_limit(store: Store) -> None:
    store.create_task("t1", OTHER)
    run, _ = store.begin_run("t1", "r1")
    for attempt in (1, 2):
        assert store.start_step(run, 0, "fetch") == attempt
        assert store.record_error(run, 0, f"boom {attempt}", 3) is False
        assert store.get_task("t1").steps[0].status is StepStatus.PENDING
    assert store.start_step(run, 0, "fetch") == 3
    assert store.record_error(run, 0, "boom 3", 3) is True
    store.end_run(run)
    task = store.get_task("t1")
    assert (task.status, task.steps[0].status, task.steps[0].attempts) == (
        TaskStatus.FAILED, StepStatus.FAILED, 3,
    )  # fmt: skip
    events = store.events("t1")
    assert [e.data["error"] for e in events if e.kind == "step_error"] == [
        "boom 1", "boom 2", "boom 3",
    ]  # fmt: skip
    assert events[-1].kind == "task_failed"
    assert "failed 3 times" in events[-1].data["reason"]
    assert invariant_violations(events) == []


def test_begin_run_recovers_a_running_step(open_: Opener) -> None:
    first = open_()
    first.create_task("t1", PLAN)
    run, _ = first.begin_run("t1", "r1")
    first.start_step(run, 0, "fetch")
    first.finish_step(run, 0, "fetch", '{"text":"x"}', last=False)
    first.start_step(run, 1, "summarize")
    first.close()  # as a killed runner: step 1 left running, its hold gone with it

    second = open_()
    run2, task = second.begin_run("t1", "r2")
    assert run2.recovered == (1,)
    assert run2.epoch == run.epoch + 1
    done, pending = StepStatus.DONE, StepStatus.PENDING
    assert [s.status for s in task.steps] == [done, pending, pending]
    assert task.steps[1].attempts == 1  # recovery keeps the count
    tail = second.events("t1")[-2:]
    assert [(e.kind, e.step_idx, e.run_id) for e in tail] == [
        ("step_recovered", 1, "r2"),
        ("run_started", None, "r2"),
    ]
    assert tail[1].data == {"recovered": [1]}
    assert second.start_step(run2, 1, "summarize") == 2
    second.end_run(run2)


def test_a_second_runner_is_refused_at_once(open_: Opener) -> None:
    holder, other = open_(), open_()
    holder.create_task("t1", PLAN)
    run, _ = holder.begin_run("t1", "r1")
    before = snapshot(other, "t1")
    started = time.monotonic()
    with pytest.raises(TaskBusy):
        other.begin_run("t1", "r2")
    assert time.monotonic() - started < 3
    assert snapshot(other, "t1") == before
    holder.end_run(run)
    run2, _ = other.begin_run("t1", "r2")  # free again once released
    assert run2.epoch == 2
    other.end_run(run2)


# -- fencing ---------------------------------------------------------------


def test_a_stale_run_raises_lease_lost_and_writes_nothing(
    open_: Opener, take_over: TakeOver
) -> None:
    zombie = open_(heartbeat=NEVER)
    zombie.create_task("t1", PLAN)
    stale, _ = zombie.begin_run("t1", "zombie")
    zombie.start_step(stale, 0, "fetch")
    take_over(zombie, stale)
    winner = open_()
    run, _ = winner.begin_run("t1", "winner")
    assert run.epoch == stale.epoch + 1
    assert run.recovered == (0,)
    winner.start_step(run, 0, "fetch")
    before = snapshot(winner, "t1")
    with pytest.raises(LeaseLost):
        zombie.check_lease(stale)
    with pytest.raises(LeaseLost):
        zombie.finish_step(stale, 0, "fetch", '{"zombie":true}', last=False)
    with pytest.raises(LeaseLost):
        zombie.record_error(stale, 0, "zombie error", 1)
    with pytest.raises(LeaseLost):
        zombie.start_step(stale, 1, "summarize")
    with pytest.raises(LeaseLost):
        zombie.finish_task(stale)
    zombie.end_run(stale)  # must not free the winner's hold
    assert snapshot(winner, "t1") == before
    with pytest.raises(TaskBusy):
        open_().begin_run("t1", "third")
    winner.finish_step(run, 0, "fetch", '{"winner":true}', last=False)
    assert winner.get_task("t1").steps[0].output == {"winner": True}
    winner.end_run(run)


def test_negative_control_without_fencing_a_stale_run_commits(
    open_: Opener, take_over: TakeOver, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same takeover as above with the test-only switch thrown: the zombie's
    finish_step lands on the winner's attempt, a false commit. Fencing is what
    stops it."""
    monkeypatch.setenv("NINELIVES_TEST_DISABLE_FENCING", "unsafe-test-only:" + url)
    zombie = open_(heartbeat=NEVER)
    zombie.create_task("t1", PLAN)
    stale, _ = zombie.begin_run("t1", "zombie")
    zombie.start_step(stale, 0, "fetch")
    take_over(zombie, stale)
    winner = open_()
    run, _ = winner.begin_run("t1", "winner")
    winner.start_step(run, 0, "fetch")
    zombie.check_lease(stale)  # no refusal
    zombie.finish_step(stale, 0, "fetch", '{"zombie":true}', last=False)
    task = winner.get_task("t1")
    assert task.steps[0].output == {"zombie": True}
    finished = [e.run_id for e in winner.events("t1") if e.kind == "step_finished"]
    assert finished == ["zombie"]
    with pytest.raises(StoreError):  # the winner's own commit now finds its step done
        winner.finish_step(run, 0, "fetch", '{"winner":true}', last=False)
    winner.end_run(run)


@pytest.mark.parametrize("value", ["1", "yes", "unsafe-test-only:", "unsafe-test-only:other.db"])
def test_the_fencing_switch_needs_the_exact_database(url: str, value: str) -> None:
    assert fencing_disabled(url, {"NINELIVES_TEST_DISABLE_FENCING": value}) is False
    assert fencing_disabled(url, {"NINELIVES_TEST_DISABLE_FENCING": "unsafe-test-only:" + url})


def test_abandon_fences_the_runner_and_the_next_claim_recovers(open_: Opener) -> None:
    runner, boss = open_(), open_()
    runner.create_task("t1", PLAN, queue="q")
    run, _ = runner.begin_run("t1", "r1")
    runner.start_step(run, 0, "fetch")
    boss.abandon_run(run)
    boss.abandon_run(run)  # a second call changes nothing (the epoch moved)
    with pytest.raises(LeaseLost):
        runner.finish_step(run, 0, "fetch", "{}", last=False)
    runner.end_run(run)
    claimed = boss.claim_next("q", "r2")
    assert claimed is not None
    run2, _ = claimed
    assert run2.recovered == (0,)
    assert run2.epoch == run.epoch + 2
    boss.end_run(run2)


# -- queues ----------------------------------------------------------------


def test_claim_next_takes_the_oldest_unheld_task_of_the_queue(open_: Opener) -> None:
    a, b = open_(), open_()
    a.create_task("solo", OTHER)  # not enqueued: only `run` takes it
    for name in ("q1", "q2", "q3"):
        a.create_task(name, OTHER, queue="q")
    a.create_task("elsewhere", OTHER, queue="other")
    assert a.unfinished("q") == 3
    first = a.claim_next("q", "ra")
    assert first is not None
    assert first[0].task_id == "q1"
    assert first[1].status is TaskStatus.RUNNING
    second = b.claim_next("q", "rb")
    assert second is not None
    assert second[0].task_id == "q2"
    third = b.claim_next("q", "rc", skip=["q3"])
    assert third is None
    # finish q2 and release it: done tasks are never claimed again
    run_b = second[0]
    b.start_step(run_b, 0, "fetch")
    b.finish_step(run_b, 0, "fetch", "{}", last=True)
    b.end_run(run_b)
    assert a.unfinished("q") == 2
    fourth = b.claim_next("q", "rd")
    assert fourth is not None
    assert fourth[0].task_id == "q3"
    assert b.claim_next("q", "re") is None
    a.end_run(first[0])
    again = b.claim_next("q", "rf")  # released, not done: claimable again
    assert again is not None
    assert again[0].task_id == "q1"
    assert b.claim_next("other", "rg") is not None
    assert b.claim_next("none", "rh") is None


def test_claim_next_never_takes_a_task_held_by_run(open_: Opener) -> None:
    a, b = open_(), open_()
    a.create_task("t1", OTHER, queue="q")
    run, _ = a.begin_run("t1", "r1")
    assert b.claim_next("q", "r2") is None
    a.end_run(run)
    assert b.claim_next("q", "r3") is not None


def test_an_expired_claim_is_recovered_like_a_restart(open_: Opener, take_over: TakeOver) -> None:
    dead = open_(heartbeat=NEVER)
    dead.create_task("t1", PLAN, queue="q")
    claimed = dead.claim_next("q", "dead")
    assert claimed is not None
    stale = claimed[0]
    dead.start_step(stale, 0, "fetch")
    take_over(dead, stale)
    heir = open_()
    claimed = heir.claim_next("q", "heir")
    assert claimed is not None
    run, task = claimed
    assert run.recovered == (0,)
    assert task.steps[0].status is StepStatus.PENDING
    assert [(e.kind, e.step_idx) for e in heir.events("t1")][-2:] == [
        ("step_recovered", 0),
        ("run_started", None),
    ]
    with pytest.raises(LeaseLost):
        dead.finish_step(stale, 0, "fetch", "{}", last=False)
    heir.end_run(run)


# -- schema ------------------------------------------------------------------


def test_reopening_keeps_everything(open_: Opener) -> None:
    first = open_()
    first.create_task("t1", PLAN)
    before = snapshot(first, "t1")
    first.close()
    first.close()  # idempotent
    assert snapshot(open_(), "t1") == before


def test_a_newer_schema_is_refused(open_: Opener, backend: str, url: str) -> None:
    open_().close()
    if backend == "sqlite":
        import sqlite3

        with sqlite3.connect(url) as conn:
            conn.execute("PRAGMA user_version = 999")
    else:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO ninelives_schema VALUES (999, 'future', 0)")
    with pytest.raises(StoreError, match="newer"):
        open_()


def test_the_lease_is_held_past_its_length_while_renewed(open_: Opener) -> None:
    """Between commits only the heartbeat renews: the holder does nothing at all
    for 2.5 leases, and another runner must still be refused. (Calling
    ``check_lease`` first would prove nothing: it renews a lapsed lease that
    nobody took, see test_heartbeat.py.)"""
    holder = open_()  # heartbeat every LEASE/3
    holder.create_task("t1", PLAN, queue="q")
    run, _ = holder.begin_run("t1", "r1")
    other = open_()
    time.sleep(LEASE * 2.5)
    with pytest.raises(TaskBusy):
        other.begin_run("t1", "r2")
    assert other.claim_next("q", "r3") is None
    holder.check_lease(run)
    holder.start_step(run, 0, "fetch")
    holder.end_run(run)


def test_create_stores_each_step_row_as_the_plan_gives_it(store: Store, url: str) -> None:
    """SQLite inserts every step in one statement, its texts carried in a JSON
    array: each row must still hold exactly the texts one insert per step would
    (escapes, non-ASCII, a policy or NULL), in order past ten steps."""
    from ninelives.store.rules import step_rows

    inputs = [{"text": 'é " \\ \n \u2028 😀', "n": i} for i in range(12)]
    steps = [{"tool": f"t{i}", "input": given} for i, given in enumerate(inputs)]
    steps[3]["max_attempts"] = 2  # a policy key on the step
    plan = plan_from_dict({"goal": "rows", "steps": steps})
    store.create_task("rows", plan)
    want = [(r["idx"], r["tool"], r["input"], r["policy"]) for r in step_rows("rows", plan)]
    query = "SELECT idx, tool, input, policy FROM steps WHERE task_id = 'rows' ORDER BY idx"
    if is_postgres_url(url):
        import psycopg

        with psycopg.connect(url) as conn:
            found = [tuple(r) for r in conn.execute(query).fetchall()]
    else:
        import sqlite3

        conn = sqlite3.connect(url)
        try:
            found = conn.execute(query).fetchall()
        finally:
            conn.close()
    assert found == want
    assert want[3][3] is not None
    assert want[4][3] is None
    assert [s.input for s in store.get_task("rows").steps] == inputs


def test_sqlite_create_keeps_a_nul_in_a_tool_name(tmp_path: Path) -> None:
    """A plan given as a Plan object names its tools as registered: SQLite
    stores a NUL in a name as one insert per step does. The texts travel in a
    JSON array that SQLite's json_extract cuts at a NUL: 'a\\x00b' must not be
    stored as 'a' (and the task then refused as changed since its create)."""
    import sqlite3

    from ninelives.plan import Plan, StepSpec

    url = str(tmp_path / "state.db")
    store = open_store(url)
    try:
        tools = ["a\x00b", "plain", "\x00"]
        plan = Plan(goal="nul", steps=tuple(StepSpec(tool=t, input={"n": 1}) for t in tools))
        store.create_task("nul", plan)
        conn = sqlite3.connect(url)
        try:
            stored = [r[0] for r in conn.execute("SELECT tool FROM steps ORDER BY idx")]
        finally:
            conn.close()
        assert stored == tools
        assert [s.tool for s in store.get_task("nul").steps] == tools
        run, _ = store.begin_run("nul", "r1", start_first=True)  # the digest still matches
        assert run.started == (0, 1)
        store.end_run(run)
    finally:
        store.close()


def test_a_taken_id_is_refused_before_a_plan_the_store_cannot_digest(store: Store) -> None:
    """Create checks the id first: a taken id (in any case) is TaskExists even when
    the plan, given as a Plan object, holds a value its digest cannot encode
    (NaN, a lone surrogate); a new id gets the plan's own error. Nothing written."""
    import math

    from ninelives.plan import Plan, StepSpec

    store.create_task("Taken", plan_from_dict({"goal": "g", "steps": [{"tool": "a", "input": {}}]}))
    before = store.events("Taken")
    policies = [({"timeout": math.nan}, "not JSON compliant"), ({"x": "\ud800"}, "surrogates")]
    for policy, why in policies:
        bad = Plan(goal="g", steps=(StepSpec(tool="a", input={}, policy=policy),))
        for task_id in ("Taken", "taken"):
            with pytest.raises(TaskExists):
                store.create_task(task_id, bad)
        with pytest.raises(ValueError, match=why):
            store.create_task("fresh", bad)
    assert store.task_ids() == ["Taken"]
    assert store.events("Taken") == before


def test_sqlite_reading_a_task_reads_its_goal_once(tmp_path: Path) -> None:
    """The task and its steps are read in one statement: the task's columns must
    not come back with every step, or a long goal (a workflow's arguments, up
    to a MiB) is copied once per step (a MiB times 5000 steps: 5 GB per read)."""
    import tracemalloc

    from ninelives.plan import Plan, StepSpec

    store = open_store(str(tmp_path / "state.db"))
    try:
        goal = "g" * 100_000
        steps = tuple(StepSpec(tool="t", input={"i": i}) for i in range(600))
        store.create_task("long", Plan(goal=goal, steps=steps))
        tracemalloc.start()
        try:
            task = store.get_task("long")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert task.goal == goal
        assert [s.input for s in task.steps] == [{"i": i} for i in range(600)]
        assert peak < 10 * len(goal) + 5_000_000  # not 600 copies of the goal (60 MB)
        run, claimed = store.begin_run("long", "r1", start_first=True)
        assert (claimed.goal, len(claimed.steps), run.started) == (goal, 600, (0, 1))
        store.end_run(run)
        empty = Plan(goal=goal, steps=())
        store.create_task("none", empty)
        assert (store.get_task("none").goal, store.get_task("none").steps) == (goal, ())
    finally:
        store.close()


def test_move_artifacts_only_while_no_step_has_started(store: Store, tmp_path: Path) -> None:
    first, given = str(tmp_path / "first"), str(tmp_path / "given")
    store.create_task("t1", PLAN, artifacts=first)
    store.create_task("guide", PLAN)  # no folder recorded: the runner's settings decide
    assert store.move_artifacts("t1", given) is True
    assert store.get_task("t1").artifacts == given
    assert store.move_artifacts("t1", given) is False  # idempotent: nothing to change
    assert store.move_artifacts("guide", given) is False
    assert store.get_task("guide").artifacts is None
    assert store.move_artifacts("nope", given) is False

    run, _ = store.begin_run("t1", "r1", start_first=True)
    store.end_run(run)
    # A step has started: something may be published in the recorded folder.
    assert store.move_artifacts("t1", first) is False
    assert store.get_task("t1").artifacts == given
