"""Housekeeping on PostgreSQL: the reads of ``ls``, ``gc`` and ``doctor`` and the
writes of ``gc`` and ``doctor --fix``, mixed into
:class:`~ninelives.store.postgres.store.PostgresStore`.

Every query is named in ``sql/postgres.sql`` and reaches its rows through an
index (migration 0007).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg

from ... import crashpoints
from ...errors import StoreError
from ...models import Deleted, MetricCounts, TaskHold, TaskSummary, step_durations
from .. import sql
from ..housekeeping import LocalFiles
from ..rules import newest_first
from .base import Q, Session, scalar

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
        before taking over early (:func:`holder_alive`): so housekeeping never
        calls a holder gone that ``run`` would wait for."""
        conn = self._connection()
        try:
            row = conn.execute(Q["holder_owner"], {"id": task_id, "epoch": epoch}).fetchone()
            if row is None:
                return False
            return holder_alive(conn, task_id, epoch, row[0], host_identity()) is None
        except psycopg.Error as exc:
            self._drop()
            raise StoreError(f"cannot read {self._shown}: {self._why(exc)}") from exc

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

    def integrity_problems(self) -> list[str]:
        """None to report: the server checks its own pages (checksums, WAL)."""
        return []

    def schema_version(self) -> tuple[int, int]:
        """``(stored, newest this version knows)``."""
        latest = sql.migrations("postgres")[-1][0]
        if self._empty:
            return 0, latest
        with self._read() as conn:
            row = conn.execute(Q["schema_version"]).fetchone()
        return (int(row[0]) if row else 0), latest


def host_identity() -> str | None:
    """What makes one of this process's pids mean the same process to another:
    the same boot of the same machine (Linux ``boot_id``) and the same PID
    namespace (the inode of ``/proc/self/ns/pid``), hashed short. None where
    either cannot be read: then no holder is ever provably dead here."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    if not boot:
        return None
    return hashlib.sha256(f"{boot}:{namespace}".encode()).hexdigest()[:16]


def holder_dead_here(owner: str | None, here: str | None) -> bool:
    """True only if ``owner`` (a ``lease_owner``) names a process of this
    machine and PID namespace (``here``) that no longer exists. An owner
    without an identity (an older version, a host without one) is never dead:
    a pid of another machine says nothing here. A pid reused since is taken
    for the holder alive, the safe side."""
    parts = (owner or "").split("/")
    if here is None or len(parts) != 4 or parts[3] != here or not parts[1].isdigit():
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # it exists (EPERM: another user's), or cannot be told
    return False


def holder_alive(
    conn: Conn, task_id: str, epoch: int, owner: str | None, here: str | None
) -> str | None:
    """Why the holder of the live lease ``epoch`` may still be running, or None
    when it is provably gone: the one rule of ``run``'s early takeover and of
    ``doctor``. The lease is the truth; its holder's session advisory lock tells
    only when that lock is free *and* was taken in the server's current life (a
    restart frees the locks of live holders) *and* the holder's process is
    provably gone from this machine (``owner`` read by :func:`holder_dead_here`):
    sessions also end under a live process (``pg_terminate_backend``,
    ``idle_session_timeout``, a pooler), so a free lock alone proves nothing."""
    holder = {"id": task_id, "epoch": epoch}
    if not scalar(conn, Q["holder_probe"], holder):
        return f"task {task_id!r} is being run by another live process (its lease is held)"
    conn.execute(Q["holder_probe_end"], holder)
    if not scalar(conn, Q["holder_gone"], {"id": task_id}):
        return (
            f"task {task_id!r} is held by a lease taken before the database server "
            "restarted, so its holder may still be running: the lease is honoured until "
            "it expires or is released"
        )
    if not holder_dead_here(owner, here):
        return (
            f"task {task_id!r} is held by a lease whose holder ({owner}) may still be "
            "running: its database sessions ended, but its process is not provably gone "
            "from this machine; the lease is honoured until it expires or is released"
        )
    return None
