"""No query on the hot path scans a table: checked with SQLite's
``EXPLAIN QUERY PLAN`` and PostgreSQL's ``EXPLAIN`` (with sequential scans
priced out, so that a plan still showing one has no index to use)."""

from __future__ import annotations

import json
import re

import pytest
from test_store_contract import OTHER, PLAN, Opener, open_, url  # noqa: F401  (fixtures)

from ninelives.store import sql

#: Every query a run, a recovery, status, export, a worker's claim, ls and gc make.
HOT = (
    "get_task", "get_steps", "get_task_steps", "task_id_taken", "insert_task_unless_taken",
    "claim", "running_steps", "recover_steps", "recoveries", "step_running",
    "step_running_fenced", "fenced", "step_done", "step_done_fenced", "step_back", "append_head",
    "append_head_fenced",
    "step_failed", "fail_task", "fence", "fence_read", "events", "unfinished", "claim_candidates",
    "claim_next", "lease_state", "holder_gone", "abandon", "renew", "release", "retry_task",
    "retry_step", "ls_page", "ls_page_status", "ls_page_queue", "ls_page_status_queue", "ls_rows",
    "gc_candidates", "gc_recheck", "gc_events", "gc_steps", "gc_tasks", "gc_remember",
    "tasks_in_status",
)  # fmt: skip
TABLES = ("tasks", "steps", "events", "removed_tasks")
#: SQLite: a table read whole ("SCAN tasks", or an alias of one), not through an index.
SQLITE_SCAN = re.compile(
    r"^SCAN (tasks|steps|events|removed_tasks|t|s|e)\b(?! USING (COVERING )?INDEX)"
)
#: Walking an index in order under a LIMIT (ls: the newest N) reads N entries.
ORDERED_UNDER_LIMIT = ("ls_page",)


def _params(dialect: str) -> dict[str, object]:
    ids: object = ["t1", "t2"]
    statuses: object = ["done", "failed"]
    skip: object = []
    if dialect == "sqlite":
        ids, statuses, skip = json.dumps(ids), json.dumps(statuses), json.dumps(skip)
    return {
        "id": "t1", "idx": 0, "now": 1.0, "delay": None, "status": "done", "epoch": 1,
        "queue": "default",
        "after_ts": 0.0, "after_id": "", "page": 64, "limit": 20, "ids": ids,
        "statuses": statuses, "before": 2.0, "skip": skip, "owner": "o", "lease": 30.0,
        "output": "{}", "refusal": "0", "goal": "g", "artifacts": None, "plan_sha256": None,
        "run": "r", "head": '{"attempt":', "tail": "}",
    }  # fmt: skip


def _hot(dialect: str) -> list[str]:
    queries = sql.load_queries(dialect)
    return [name for name in HOT if name in queries]


def test_no_hot_query_scans_a_table(open_: Opener, url: str) -> None:  # noqa: F811
    store = open_()
    store.create_task("t1", PLAN, queue="default")
    store.create_task("t2", OTHER)
    dialect = store.dialect  # type: ignore[attr-defined]
    queries = sql.load_queries(dialect)
    problems = []
    for name in _hot(dialect):
        plan = _explain(store, url, queries[name], _params(dialect))
        for line in plan:
            if dialect == "sqlite":
                bad = SQLITE_SCAN.match(line.strip()) or (
                    "TEMP B-TREE" in line and name not in ("ls_rows",)
                )
            else:
                bad = re.search(r"Seq Scan on (tasks|steps|events|removed_tasks)\b", line)
            if bad:
                problems.append(f"{name}: {line.strip()}")
        if dialect == "sqlite" and name not in ORDERED_UNDER_LIMIT:
            assert not any(re.match(r"\s*SCAN tasks USING", x) for x in plan), (name, plan)
    assert problems == [], "\n".join(problems)
    assert len(_hot(dialect)) >= 30


def _explain(store: object, url: str, query: str, params: dict[str, object]) -> list[str]:  # noqa: F811
    if not url.startswith("postgresql"):
        import sqlite3

        conn = sqlite3.connect(url)
        try:
            rows = conn.execute("EXPLAIN QUERY PLAN " + query, params).fetchall()
        finally:
            conn.close()
        return [str(row[-1]) for row in rows]
    import psycopg

    with psycopg.connect(url) as conn:  # one transaction, rolled back: EXPLAIN runs nothing
        conn.execute("SET LOCAL enable_seqscan = off")
        cur = psycopg.ClientCursor(conn)
        rows = cur.execute("EXPLAIN " + query, params).fetchall()
        conn.rollback()
    return [str(row[0]) for row in rows]


def test_the_check_sees_a_scan() -> None:
    """Negative control: without the index, the same check reports the scan."""
    import sqlite3

    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE tasks (id TEXT PRIMARY KEY, status TEXT, updated_at REAL)")
    rows = conn.execute(
        "EXPLAIN QUERY PLAN SELECT id FROM tasks WHERE status = :status", {"status": "running"}
    ).fetchall()
    assert any(SQLITE_SCAN.match(str(row[-1])) for row in rows), rows
    conn.execute("CREATE INDEX tasks_status_updated ON tasks (status, updated_at, id)")
    rows = conn.execute(
        "EXPLAIN QUERY PLAN SELECT id FROM tasks WHERE status = :status", {"status": "running"}
    ).fetchall()
    assert not any(SQLITE_SCAN.match(str(row[-1])) for row in rows), rows


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_both_dialects_name_the_same_housekeeping_queries(dialect: str) -> None:
    names = set(sql.load_queries(dialect))
    for name in ("ls_page", "ls_rows", "gc_candidates", "gc_recheck", "gc_events", "gc_steps",
                 "gc_tasks", "tasks_in_status", "artifact_folders", "dangling_rows"):  # fmt: skip
        assert name in names, (dialect, name)
