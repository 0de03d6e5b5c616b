"""Housekeeping on PostgreSQL: the reads of ``ls``, ``gc`` and ``doctor`` and the
writes of ``gc`` and ``doctor --fix``, mixed into
:class:`~ninelives.store.postgres.store.PostgresStore`.

Every query is named in ``sql/postgres.sql`` and reaches its rows through an
index (migration 0007).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import psycopg

from ... import crashpoints
from ...errors import StoreError
from ...models import Deleted, MetricCounts, TaskHold, TaskSummary, step_durations
from .. import sql
from ..housekeeping import LocalFiles
from ..rules import newest_first
from .base import Q, Session

Conn = psycopg.Connection[Any]


class PostgresHousekeeping(Session):
    """The housekeeping methods, on the store's sessions."""

    def list_tasks(
        self, *, statuses: Sequence[str] = (), queue: str | None = None, limit: int = 50
    ) -> list[TaskSummary]:
        """The newest ``limit`` tasks (of ``statuses`` and ``queue`` when given),
        newest first, each with its steps done, attempts and last event."""
        if self._empty:
            return []
        with self._read() as conn:
            ids = list(self._page(conn, statuses, queue, limit))
            if not ids:
                return []
            rows = conn.execute(Q["ls_rows"], {"ids": ids}).fetchall()
        return newest_first([TaskSummary.from_row(r) for r in rows], limit)

    @staticmethod
    def _page(conn: Conn, statuses: Sequence[str], queue: str | None, limit: int) -> Iterator[str]:
        if not statuses:
            name = "ls_page" if queue is None else "ls_page_queue"
            yield from (r[0] for r in conn.execute(Q[name], {"queue": queue, "limit": limit}))
            return
        for status in statuses:  # one indexed page per status, merged by the caller
            name = "ls_page_status" if queue is None else "ls_page_status_queue"
            params = {"status": status, "queue": queue, "limit": limit}
            yield from (r[0] for r in conn.execute(Q[name], params).fetchall())

    def gc_candidates(
        self, status: str, before: float, *, after: tuple[float, str], limit: int
    ) -> list[tuple[str, float]]:
        """``(id, updated_at)`` of up to ``limit`` tasks of ``status`` last changed
        before ``before`` and after the ``(updated_at, id)`` cursor ``after``, oldest first."""
        if self._empty:
            return []
        params = {"status": status, "before": before, "after_ts": after[0],
                  "after_id": after[1], "limit": limit}  # fmt: skip
        with self._read() as conn:
            return [(r[0], r[1]) for r in conn.execute(Q["gc_candidates"], params).fetchall()]

    def delete_tasks(self, ids: Sequence[str], statuses: Sequence[str], before: float) -> Deleted:
        """Delete those of ``ids`` that are still of ``statuses``, last changed before
        ``before`` and not held by a live lease, with their steps and journal, in
        one transaction (rows locked by another transaction are left for later).
        Each id deleted is recorded in ``removed_tasks``: it is never used again."""
        with self._write() as conn:
            params = {"ids": list(ids), "statuses": list(statuses), "before": before}
            gone = [r[0] for r in conn.execute(Q["gc_recheck"], params).fetchall()]
            events = conn.execute(Q["gc_events"], {"ids": gone})
            steps = conn.execute(Q["gc_steps"], {"ids": gone})
            conn.execute(Q["gc_tasks"], {"ids": gone})
            conn.execute(Q["gc_remember"], {"ids": gone})
            crashpoints.crash("gc_before_commit")
        return Deleted(tasks=tuple(gone), steps=steps.rowcount, events=events.rowcount)

    def metric_counts(self) -> MetricCounts:
        """Tasks and steps by status, all attempts, all recoveries (``/metrics``)."""
        if self._empty:
            return MetricCounts({}, {}, 0, 0)
        steps: dict[str, int] = {}
        attempts = 0
        with self._read() as conn:
            tasks = {str(r[0]): int(r[1]) for r in conn.execute(Q["metric_tasks"])}
            for status, count, tried in conn.execute(Q["metric_steps"]).fetchall():
                steps[str(status)] = int(count)
                attempts += int(tried)
            row = conn.execute(Q["metric_recoveries"]).fetchone()
            started, durations = step_durations(conn.execute(Q["metric_durations"]).fetchall())
        recoveries = int(row[0]) if row else 0
        return MetricCounts(tasks, steps, attempts, recoveries, started, durations)

    def tasks_in_status(self, status: str) -> list[TaskHold]:
        """The tasks of ``status`` with their lease, and whether it expired."""
        if self._empty:
            return []
        with self._read() as conn:
            rows = conn.execute(Q["tasks_in_status"], {"status": status}).fetchall()
        return [TaskHold(r[0], r[1], r[2], r[3], r[4], bool(r[5])) for r in rows]

    def local_files(self) -> LocalFiles | None:
        """None: a lease in a row, not a lock file, holds a running task here."""
        return None

    def holder_gone(self, task_id: str, epoch: int) -> bool:
        """Whether the holder of a live lease is provably gone, as ``run`` decides
        before taking over early: its sessions' advisory lock is free, and it
        claimed the task since the server last started."""
        conn = self._connection()
        holder = {"id": task_id, "epoch": epoch}
        try:
            if not conn.execute(Q["holder_probe"], holder).fetchone()[0]:  # type: ignore[index]
                return False
            conn.execute(Q["holder_probe_end"], holder)
            row = conn.execute(Q["holder_gone"], {"id": task_id}).fetchone()
        except psycopg.Error as exc:
            self._drop()
            raise StoreError(f"cannot read {self._shown}: {self._why(exc)}") from exc
        return bool(row and row[0])

    def expired_leases(self) -> list[tuple[str, str, int, str, float]]:
        """``(id, status, epoch, owner, seconds since expiry)`` of every lease whose
        holder stopped renewing it."""
        if self._empty:
            return []
        with self._read() as conn:
            return [tuple(r) for r in conn.execute(Q["expired_leases"]).fetchall()]

    def clear_expired_lease(self, task_id: str, epoch: int) -> bool:
        """Free an expired lease under a new epoch; False if it changed meanwhile."""
        with self._write() as conn:
            cur = conn.execute(Q["clear_expired_lease"], {"id": task_id, "epoch": epoch})
        return cur.rowcount == 1

    def dangling_rows(self) -> dict[str, int]:
        """How many journal events and steps belong to no stored task."""
        if self._empty:
            return {}
        with self._read() as conn:
            rows = conn.execute(Q["dangling_rows"]).fetchall()
        return {r[0]: int(r[1]) for r in rows if r[1]}

    def delete_dangling(self) -> None:
        """Delete the journal events and steps that belong to no stored task."""
        with self._write() as conn:
            conn.execute(Q["delete_dangling_events"])
            conn.execute(Q["delete_dangling_steps"])

    def artifact_folders(self) -> list[str]:
        """Every artifacts folder recorded with a task."""
        if self._empty:
            return []
        with self._read() as conn:
            return [r[0] for r in conn.execute(Q["artifact_folders"]).fetchall()]

    def schema_version(self) -> tuple[int, int]:
        """``(stored, newest this version knows)``."""
        latest = sql.migrations("postgres")[-1][0]
        if self._empty:
            return 0, latest
        with self._read() as conn:
            row = conn.execute(Q["schema_version"]).fetchone()
        return (int(row[0]) if row else 0), latest
