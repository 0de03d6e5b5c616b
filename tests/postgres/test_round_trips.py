"""Round trips per step transition on PostgreSQL, counted on the wire.

libpq traces every protocol message of the store's session; a round trip is
the client sending and then reading replies (a line ``F`` followed by a line
``B`` in the trace). Each fenced transition (start a step, finish it, save
progress, finish the task) is one round trip: BEGIN, the fence, the writes and
COMMIT go in one flush, and the server, not the client, checks the fence. A
change that waits for a reply in the middle (a round trip more per step) fails
here. The refusals keep their meaning: a stale runner still gets LeaseLost,
with nothing written and its session still usable.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from psycopg import pq

from ninelives.errors import LeaseLost, StoreError
from ninelives.plan import plan_from_dict
from ninelives.store.postgres.store import PostgresStore

pytestmark = pytest.mark.postgres

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
NEVER = 3600.0  # no heartbeat thread beats during a test


def round_trips(trace: str) -> int:
    """How often the client sent and then waited for replies, in a libpq trace."""
    sides = "".join(line[0] for line in trace.splitlines() if line[:2] in ("F\t", "B\t"))
    return sides.count("FB")


@contextmanager
def counted(store: PostgresStore) -> Iterator[list[int]]:
    """Trace the store's session for the block; the list then holds its round trips."""
    conn = store._connection()
    found: list[int] = []
    with tempfile.TemporaryFile("w+") as fh:
        conn.pgconn.trace(fh.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            yield found
        finally:
            conn.pgconn.untrace()  # flushes libpq's buffer into the file
            fh.seek(0)
            found.append(round_trips(fh.read()))
    assert store._conn is conn, "the session was made again: the count is not of one session"


@pytest.fixture
def store(pg_database: str) -> Iterator[PostgresStore]:
    opened = PostgresStore(pg_database, heartbeat=NEVER)
    yield opened
    opened.close()


def test_each_step_transition_is_one_round_trip(store: PostgresStore) -> None:
    store.create_task("t1", PLAN)
    run, _ = store.begin_run("t1", "r1")
    for idx, tool in enumerate(("fetch", "summarize", "write_artifact")):
        with counted(store) as start:
            assert store.start_step(run, idx, tool) == 1
        with counted(store) as progress:
            store.checkpoint(run, idx, '{"next": 1}')
        with counted(store) as finish:
            store.finish_step(run, idx, tool, '{"ok": true}', last=idx == 2)
        assert (start, progress, finish) == ([1], [1], [1]), (idx, tool)
    store.end_run(run)
    kinds = [e.kind for e in store.events("t1")]
    assert kinds[-4:] == ["step_started", "step_progress", "step_finished", "task_done"]
    started = [e.data for e in store.events("t1") if e.kind == "step_started"]
    assert [d["attempt"] for d in started] == [1, 1, 1]
    assert [d["tool"] for d in started] == ["fetch", "summarize", "write_artifact"]


def test_finish_task_is_one_round_trip(store: PostgresStore) -> None:
    store.create_task("t1", PLAN)
    run, _ = store.begin_run("t1", "r1")
    for idx, tool in enumerate(("fetch", "summarize", "write_artifact")):
        store.start_step(run, idx, tool)
        store.finish_step(run, idx, tool, "{}", last=False)
    with counted(store) as done:
        store.finish_task(run)
    assert done == [1]
    store.end_run(run)


def test_a_closed_fence_still_refuses_and_writes_nothing(store: PostgresStore) -> None:
    store.create_task("t1", PLAN)
    stale, _ = store.begin_run("t1", "r1")
    store.abandon_run(stale)  # a new epoch: the runner of ``stale`` is fenced out
    before = [e.kind for e in store.events("t1")]
    with pytest.raises(LeaseLost):  # then a read of why (a cancel?): the rare path
        store.start_step(stale, 0, "fetch")
    with pytest.raises(LeaseLost):
        store.finish_step(stale, 0, "fetch", "{}", last=False)
    assert [e.kind for e in store.events("t1")] == before
    assert store.get_task("t1").steps[0].attempts == 0  # nothing written, session usable


def test_a_step_not_running_is_refused_with_the_same_error(store: PostgresStore) -> None:
    store.create_task("t1", PLAN)
    run, _ = store.begin_run("t1", "r1")
    with pytest.raises(StoreError, match="step 0 is not running"):
        store.finish_step(run, 0, "fetch", "{}", last=False)
    with pytest.raises(StoreError, match="step 1 is not running"):
        store.checkpoint(run, 1, "{}")
    store.start_step(run, 0, "fetch")
    with pytest.raises(StoreError, match="step 0 is not pending"):
        store.start_step(run, 0, "fetch")
    assert [e.kind for e in store.events("t1")][-1] == "step_started"
    store.finish_step(run, 0, "fetch", "{}", last=False)  # the fence held throughout
    store.end_run(run)


def test_a_claim_and_a_read_keep_their_round_trips(store: PostgresStore) -> None:
    """Once per run, not per step, but counted too: the claim reads the lease, the
    task (its row and steps in one round trip), recovers, reads the task again
    and starts its first pending step (found in that read, not asked of the
    server: a round trip fewer); a worker's claim skips the lease read and the start."""
    store.create_task("t1", PLAN)
    store.create_task("t2", PLAN, queue="q")
    with counted(store) as claim:
        run, _ = store.begin_run("t1", "r1", start_first=True)
    with counted(store) as read:
        store.get_task("t1")
    with counted(store) as release:
        store.end_run(run)
    with counted(store) as worker_claim:
        claimed = store.claim_next("q", "w1")
    assert claimed is not None
    store.end_run(claimed[0])
    assert (claim, read, release, worker_claim) == ([7], [2], [1], [5])


def test_a_session_the_server_closed_while_idle_is_no_unknown_outcome(
    store: PostgresStore, pg_database: str
) -> None:
    """A step's transition is one statement in autocommit, so an error after it
    left would be an unknown outcome (CommitUnknown, the runner stops). A session
    the server ended while it was idle (a restart, a terminated backend) is found
    before anything is sent: the statement goes on a new session, the lease still
    ours, and the holder lock is taken again there."""
    import select

    import psycopg

    store.create_task("t1", PLAN)
    run, _ = store.begin_run("t1", "r1")
    conn = store._connection()
    with psycopg.connect(pg_database, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        assert select.select([conn.pgconn.socket], [], [], 10)[0]  # its last words arrived
        assert store.start_step(run, 0, "fetch") == 1
        assert store._connection() is not conn
        locks = admin.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s",
            (store._connection().info.backend_pid,),
        ).fetchone()
        assert locks == (1,)
    store.finish_step(run, 0, "fetch", "{}", last=False)
    store.end_run(run)
