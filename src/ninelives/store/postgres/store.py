"""The PostgreSQL store: psycopg 3, leases with fencing, for runners on many hosts.

The only module that imports psycopg (``pip install ninelives[postgres]``).
Same tables and journal semantics as SQLite; what differs is the claim:

* A claim is a lease: ``lease_owner`` and ``lease_expires_at`` set on the
  database's clock, taken in the same transaction that increments
  ``lease_epoch``, recovers ``running`` steps and journals ``run_started``.
  ``run`` takes a task only if its lease is free, expired, or held by a
  runner provably gone: its sessions' shared advisory locks are free although
  it claimed the task since the server last started (``holder_lock`` and
  ``holder_gone`` in ``sql/postgres.sql``; a restart frees the locks of live
  holders too), *and* its process is gone from this very machine (its
  ``lease_owner`` names its pid and this host's identity; sessions also end
  under a live process). Holders take their locks again on every new
  connection, the heartbeat's included. Otherwise :class:`~ninelives.errors.TaskBusy`;
  workers take the oldest free or expired one with ``FOR UPDATE SKIP LOCKED``.
* Every commit a runner makes starts with the fence (``UPDATE tasks ... WHERE
  lease_epoch = :epoch``), which also renews the lease; a heartbeat thread on
  a connection of its own renews it between commits. A runner paused past its
  expiry and overtaken finds the fence closed: :class:`LeaseLost`, nothing written.
* The server checks the fence, not the client: a closed fence fails its
  statement (a refusal), so a commit never waits for a reply before COMMIT.
  Starting and finishing a step are one statement each, fence included (one
  round trip, its own transaction); other commits pipeline BEGIN, their
  statements and COMMIT in one flush. ``tests/postgres/test_round_trips.py``
  counts them on the wire.
* Before a tool's effect, :meth:`PostgresStore.check_lease` refuses to go on
  unless at least half a lease is known to remain (by the monotonic clock
  since the last confirmed renewal); otherwise it renews first.

Connections are plain sessions: no pooler in transaction mode in between,
since a session advisory lock marks a live lease holder.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import psycopg
from psycopg import errors as pg_errors

from ... import crashpoints, lineage
from ...errors import CommitUnknown, StoreError, TaskBusy, TaskExists, UnknownTask
from ...models import (
    Event,
    EventKind,
    Run,
    Step,
    StepStatus,
    Task,
    TaskStatus,
)
from ...names import check_folder_text
from ...plan import Plan
from .. import commits, recovery
from ..base import Grant
from ..conninfo import Redactor, redact_url
from ..leases import DEFAULT_LEASE, fencing_disabled, heartbeat_disabled
from ..rules import (
    first_pending_step,
    retry_target,
    step_rows,
    task_exists,
)
from .base import (
    LOCK_TIMEOUT_MS,
    Conn,
    Heartbeat,
    Lease,
    PostgresTransaction,
    Q,
    scalar,
)
from .blobs import TableBlobs
from .housekeeping import PostgresHousekeeping, holder_alive, host_identity
from .runner import StepCommits


def redact(url: str) -> str:
    """``url`` with its password, in whatever form it is given, replaced by ``***``."""
    return redact_url(url)


class PostgresStore(StepCommits, PostgresHousekeeping, commits.SharedCommits):
    """A :class:`~ninelives.store.Store` on one PostgreSQL database.

    One runner thread per store (plus its heartbeat thread); a worker with
    several slots opens one store per slot.
    """

    duplicate_key = pg_errors.UniqueViolation

    def __init__(
        self,
        url: str,
        *,
        lease: float = DEFAULT_LEASE,
        heartbeat: float | None = None,
        readonly: bool = False,
    ) -> None:
        """Connect and migrate the schema to this version; with ``readonly``, a
        session whose transactions are all read-only, which never migrates: a
        schema of another version is refused (:class:`StoreError`)."""
        self.url = url
        self._readonly = readonly
        self._empty = False
        self.lease = float(lease)
        self.heartbeat = float(heartbeat) if heartbeat is not None else self.lease / 3
        self._scrub = Redactor([url])
        self._shown = self._scrub(url)
        self._fencing = not fencing_disabled(url)
        if not self._fencing:
            print(
                f"ninelives: WARNING: fencing is OFF for {self._shown} (test-only switch)",
                file=sys.stderr,
            )
        self._beating = not heartbeat_disabled(url)
        if not self._beating:
            print(
                f"ninelives: WARNING: the lease heartbeat is OFF for {self._shown} "
                "(test-only switch)",
                file=sys.stderr,
            )
        self._owner = f"{socket.gethostname()}/{os.getpid()}"
        self._here = host_identity()
        self._mutex = threading.Lock()
        self._leases: dict[str, Lease] = {}
        self._heartbeat: Heartbeat | None = None
        self._conn: Conn | None = None
        self._pipe: psycopg.Pipeline | None = None
        self._checks: list[Callable[[], None]] = []
        self._refusals: list[Callable[[], Exception]] = []
        #: Large outputs, in the blobs tables (:mod:`ninelives.blobs`).
        self.blobs = TableBlobs(self)
        self._conn = self._connect()
        try:
            self._configure()
        except BaseException:
            self.close()
            raise

    # -- leases -------------------------------------------------------------

    def _hold(self, run: Run, sent: float) -> None:
        lease = Lease(run, self._owner, sent + self.lease)
        self._leases[run.run_id] = lease
        if not self._beating:
            return
        if self._heartbeat is None:
            self._heartbeat = Heartbeat(self)
        self._heartbeat.add(lease)

    @contextmanager
    def fenced(self, run: Run) -> Iterator[PostgresTransaction]:
        """A runner's transaction; its commit renews the lease."""
        sent = time.monotonic()
        with self.transaction() as tx:
            yield tx
        self._after_commit(run, sent)

    def _unlock_quietly(self, task_id: str, epoch: int) -> None:
        try:
            self._connection().execute(Q["holder_unlock"], {"id": task_id, "epoch": epoch})
        except (psycopg.Error, StoreError):
            self._drop()  # a closed session holds no lock

    # -- the Store protocol -------------------------------------------------

    def create_task(
        self,
        task_id: str,
        plan: Plan,
        *,
        queue: str | None = None,
        artifacts: str | None = None,
    ) -> Task:
        run_id = os.urandom(16).hex()
        try:
            with self._write() as conn:
                conn.execute(Q["task_id_lock"], {"id": task_id})
                taken = conn.execute(Q["task_id_taken"], {"id": task_id}).fetchone()
                if taken is not None:
                    raise task_exists(task_id, taken)
                digest = lineage.plan_digest(
                    plan.goal, ((s.tool, s.input, s.policy) for s in plan.steps)
                )
                conn.execute(
                    Q["insert_task"],
                    {"id": task_id, "goal": plan.goal, "queue": queue,
                     "artifacts": artifacts and check_folder_text(artifacts),
                     "plan_sha256": digest},
                )  # fmt: skip
                with conn.cursor() as cur:
                    cur.executemany(Q["insert_step"], step_rows(task_id, plan))
                self.journal_event(
                    conn,
                    task_id,
                    run_id,
                    EventKind.TASK_CREATED,
                    None,
                    {"steps": len(plan.steps)},
                )
                crashpoints.crash("create_before_commit")
        except pg_errors.UniqueViolation as exc:
            raise TaskExists(f"task {task_id!r} already exists") from exc
        return self.get_task(task_id)

    def get_task(self, task_id: str) -> Task:
        if self._empty:
            raise UnknownTask(f"unknown task {task_id!r} (no ninelives schema in {self._shown})")
        with self._read() as conn:
            return self.load(conn, task_id)

    def task_ids(self) -> list[str]:
        if self._empty:
            return []
        with self._read() as conn:
            return [row[0] for row in conn.execute(Q["task_ids"])]

    def begin_run(
        self,
        task_id: str,
        run_id: str,
        *,
        start_first: bool = False,
        check: Callable[[Task], None] | None = None,
        max_recoveries: int | None = None,
        tool_version: Callable[[str], str | None] | None = None,
        on_unknown: Callable[[Step], str] | None = None,
    ) -> tuple[Run, Task]:
        sent = time.monotonic()
        claimed: int | None = None
        try:
            with self._write() as conn:
                conn.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
                row = conn.execute(Q["lease_state"], {"id": task_id}).fetchone()
                if row is None:
                    raise UnknownTask(f"unknown task {task_id!r}")
                held, live, holder = row
                found = self.load(conn, task_id)  # raising here writes nothing
                if found.status is TaskStatus.CANCELLED:
                    raise lineage.cancelled(task_id)
                lineage.check_plan(found)
                if live:
                    self._take_over_early(conn, task_id, held, holder)
                if check is not None:
                    check(found)
                owner = self._owner_of(run_id)
                params = {"id": task_id, "owner": owner, "lease": self.lease}
                epoch = int(scalar(conn, Q["claim"], params))
                claimed = epoch
                run, task = self._recover(
                    conn,
                    task_id,
                    run_id,
                    epoch,
                    start_first,
                    max_recoveries,
                    tool_version,
                    on_unknown,
                )
        except BaseException:
            if claimed is not None:
                self._unlock_quietly(task_id, claimed)
            raise
        self._hold(run, sent)
        return run, task

    def _owner_of(self, run_id: str) -> str:
        """``lease_owner`` of a claim: ``host/pid/run``, then the host identity
        (:func:`host_identity`) when there is one, which :func:`holder_dead_here` reads."""
        owner = f"{self._owner}/{run_id}"
        return owner if self._here is None else f"{owner}/{self._here}"

    def _take_over_early(self, conn: Conn, task_id: str, held: int, owner: str | None) -> None:
        """Return only if the holder of a live lease is provably gone (see
        :func:`~ninelives.store.postgres.housekeeping.holder_alive`), else TaskBusy."""
        alive = holder_alive(conn, task_id, held, owner, self._here)
        if alive is not None:
            raise TaskBusy(alive)

    def claim_next(
        self,
        queue: str,
        run_id: str,
        *,
        skip: Sequence[str] = (),
        check: Callable[[Task], None] | None = None,
        max_recoveries: int | None = None,
        on_unknown: Callable[[Step], str] | None = None,
    ) -> tuple[Run, Task] | None:
        sent = time.monotonic()
        claimed: tuple[str, int] | None = None
        try:
            with self._write() as conn:
                row = conn.execute(
                    Q["claim_next"],
                    {"queue": queue, "skip": list(skip), "owner": self._owner_of(run_id),
                     "lease": self.lease},
                ).fetchone()  # fmt: skip
                if row is None:
                    return None
                claimed = (row[0], row[1])
                # The claim UPDATE is rolled back with the rest if the task is
                # damaged or refused: nothing is written.
                found = self.load(conn, row[0])
                lineage.check_plan(found)
                if check is not None:
                    check(found)
                run, task = self._recover(
                    conn,
                    row[0],
                    run_id,
                    row[1],
                    False,
                    max_recoveries,
                    None,
                    on_unknown,
                )
        except BaseException as exc:
            if claimed is not None:
                self._unlock_quietly(*claimed)
            elif isinstance(exc, CommitUnknown) and isinstance(exc.__cause__, psycopg.Error):
                # The claim matched no task, so its transaction wrote nothing and
                # the COMMIT's fate changes nothing: a connection lost there is a
                # plain store error (a worker waits and polls again), not an
                # unknown outcome that stops the process.
                raise self._translate(exc.__cause__, committing=False) from exc.__cause__
            raise
        self._hold(run, sent)
        return run, task

    def reopen(self) -> PostgresStore:
        return PostgresStore(self.url, lease=self.lease, heartbeat=self.heartbeat)

    def _recover(
        self,
        conn: Conn,
        task_id: str,
        run_id: str,
        epoch: int,
        start_first: bool = False,
        max_recoveries: int | None = None,
        tool_version: Callable[[str], str | None] | None = None,
        on_unknown: Callable[[Step], str] | None = None,
    ) -> tuple[Run, Task]:
        conn.execute(Q["holder_lock"], {"id": task_id, "epoch": epoch})
        recovered = [r[0] for r in conn.execute(Q["running_steps"], {"id": task_id})]
        probing, _ = recovery.recover(
            PostgresTransaction(self, conn), task_id, run_id, recovered, on_unknown,
            max_recoveries=max_recoveries,
        )  # fmt: skip
        task = self.load(conn, task_id)
        # Steps run in order: a step left running for its probe comes first.
        started = (
            self._start_first(conn, task, run_id, tool_version)
            if start_first and not probing
            else None
        )
        crashpoints.crash("recovery_before_commit")
        if started is not None:  # the row as step_running left it, not read again
            idx, attempt = started
            task = task._replace(
                steps=tuple(
                    s._replace(status=StepStatus.RUNNING, attempts=attempt, not_before=None)
                    if s.idx == idx
                    else s
                    for s in task.steps
                )
            )
        run = Run(
            task_id=task_id, run_id=run_id, epoch=epoch, recovered=tuple(recovered),
            started=started,
        )  # fmt: skip
        return run, task

    def _start_first(
        self,
        conn: Conn,
        task: Task,
        run_id: str,
        tool_version: Callable[[str], str | None] | None = None,
    ) -> tuple[int, int] | None:
        # The first pending step, found in the task the claim read rather than
        # asked of the server (a round trip fewer: first_pending_step says why).
        step = first_pending_step(task)
        if step is None:
            return None
        params = {"id": task.id, "idx": step.idx}
        started = self.fetch(conn.execute(Q["step_running"], params))
        if started is None:
            return None  # waiting out its backoff: the runner waits, then starts it
        attempt = int(started[0])
        version = tool_version(step.tool) if tool_version is not None else None
        data = lineage.started_data(step.tool, attempt, version)
        self.journal_event(conn, task.id, run_id, EventKind.STEP_STARTED, step.idx, data)
        return step.idx, attempt

    def check_lease(self, run: Run) -> None:
        if not self._fencing:
            return
        lease = self._leases.get(run.run_id)
        if lease is None or lease.lost:
            raise self.lost(run)
        if time.monotonic() < lease.valid_until - self.lease / 2:
            return
        sent = time.monotonic()
        try:
            cur = self._connection().execute(Q["renew"], self._lease_params(run))
        except psycopg.Error as exc:
            self._drop()
            raise StoreError(f"cannot renew the lease on {self._shown}: {self._why(exc)}") from exc
        self._renewed(lease, sent, ok=cur.rowcount == 1)
        if lease.lost:
            raise self.lost(run)

    def end_run(self, run: Run) -> None:
        self._leases.pop(run.run_id, None)
        if self._heartbeat is not None:
            self._heartbeat.remove(run.run_id)
        try:
            self._connection().execute(Q["release"], {"id": run.task_id, "epoch": run.epoch})
        except (psycopg.Error, StoreError):
            self._drop()  # the lease expires by itself, and a closed session holds no lock

    def abandon_run(self, run: Run) -> None:
        try:
            self._connection().execute(Q["abandon"], {"id": run.task_id, "epoch": run.epoch})
        except (psycopg.Error, StoreError):
            self._drop()  # then the lease expires by itself

    def unfinished(self, queue: str, *, skip: Sequence[str] = ()) -> int:
        with self._read() as conn:
            row = conn.execute(Q["unfinished"], {"queue": queue, "skip": list(skip)}).fetchone()
        return int(row[0]) if row else 0

    def retry_task(
        self,
        task_id: str,
        run_id: str,
        *,
        step: int | None = None,
        grant: Grant | None = None,
    ) -> Task:
        with self.operator(task_id) as tx:
            conn = tx.conn
            task = self.load(conn, task_id)
            granted = grant(task) if grant is not None and step is None else None
            if granted is not None:
                lineage.check_plan(task)
                by, append, data = granted
                self.append_steps(conn, task_id, run_id, by, append)
                conn.execute(Q["retry_task"], {"id": task_id})
                self.journal_event(conn, task_id, run_id, EventKind.TASK_RETRIED, None, data)
            else:
                idx = retry_target(task, step)
                conn.execute(Q["retry_task"], {"id": task_id})
                conn.execute(Q["retry_step"], {"id": task_id, "idx": idx})
                self.journal_event(
                    conn, task_id, run_id, EventKind.TASK_RETRIED, idx,
                    {"attempts": task.steps[idx].attempts},
                )  # fmt: skip
        return self.get_task(task_id)

    @contextmanager
    def operator(
        self, task_id: str, check: Callable[[Task], object] | None = None
    ) -> Iterator[PostgresTransaction]:
        """A person's command on a task (retry, a decision): the transaction takes
        the task as a claim would, its holder provably gone (:class:`TaskBusy`
        at once while a live runner holds it). ``check`` is left to the rule,
        which reads the task inside the transaction."""
        with self.transaction() as tx:
            tx.conn.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
            row = tx.conn.execute(Q["lease_state"], {"id": task_id}).fetchone()
            if row is None:
                raise UnknownTask(f"unknown task {task_id!r}")
            held, live, holder = row
            # As in begin_run: free only if its holder is provably gone; a cancelled
            # task never moves again, so the rule refuses it whoever holds it.
            cancelled = live and self.load(tx.conn, task_id).status is TaskStatus.CANCELLED
            if live and not cancelled:
                self._take_over_early(tx.conn, task_id, held, holder)
            yield tx

    def events(self, task_id: str) -> list[Event]:
        if self._empty:
            return []
        with self._read() as conn:
            rows = conn.execute(Q["events"], {"id": task_id}).fetchall()
        return [Event.from_row(row) for row in rows]

    def blob_rows(self) -> list[tuple[str, int, str]]:
        """``(task_id, idx, output)`` of every output that is, or holds, a blob reference."""
        if self._empty:
            return []
        with self._read() as conn:
            return [(str(r[0]), int(r[1]), str(r[2])) for r in conn.execute(Q["blob_rows"])]

    def close(self) -> None:
        for lease in list(self._leases.values()):
            self.end_run(lease.run)
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        self._drop()
        self._closed = True
