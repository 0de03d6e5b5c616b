"""PostgreSQL sessions for :mod:`ninelives.store.postgres`: connections, pipelined
transactions, the schema's set-up, and the heartbeat that renews leases. With
:mod:`~ninelives.store.postgres`, the only modules that import psycopg."""

from __future__ import annotations

import logging
import select
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import pq

# psycopg logs a warning when it leaves a pipeline aborted by an error that we
# handle ourselves (a unique violation at create, say). With no logging set
# up, Python's last-resort handler would print it: a second stderr line next
# to the command's one-line error. A handler on psycopg's logger stops that;
# an application that configures logging still gets the records.
if not logging.getLogger("psycopg").handlers:
    logging.getLogger("psycopg").addHandler(logging.NullHandler())

from ... import crashpoints
from ...blobs import resolve_task
from ...errors import LeaseLost, StoreError, TaskBusy, UnknownTask
from ...journal import dumps
from ...models import EventKind, Run, Step, Task, TaskStatus
from ...names import check_folder_text
from .. import sql
from ..commits import Journaling
from ..rules import unknown_outcome

if TYPE_CHECKING:
    from .blobs import TableBlobs

Q = sql.load_queries("postgres")
#: How a refusal reads in the server's error: see ``fence`` in ``sql/postgres.sql``.
REFUSED = "ninelives-refused:"
CONNECT_TIMEOUT = 10
#: How long ``run`` waits for a row another runner is committing to, before exit 3.
LOCK_TIMEOUT_MS = 2000

Conn = psycopg.Connection[Any]


def _say(exc: BaseException, scrub: Callable[[str], str] = str) -> str:
    """One line of a driver error, passed through ``scrub``: psycopg echoes a
    connection string it cannot parse, password and all."""
    return scrub(" ".join(str(exc).split()) or type(exc).__name__)


def rolled_back(exc: BaseException, conn: Conn) -> bool:
    """Whether ``exc`` is the server's ERROR on a session that lives on: a statement
    of the transaction, or its COMMIT, failed, so it committed nothing. No answer
    (a cut link) or a FATAL that ends the session leaves a COMMIT's outcome unknown."""
    return (
        isinstance(exc, psycopg.Error)
        and exc.sqlstate is not None
        and exc.diag.severity_nonlocalized == "ERROR"
        and not (conn.broken or conn.closed)
    )


def scalar(conn: Conn, query: str, params: dict[str, Any]) -> Any:
    row = conn.execute(query, params).fetchone()
    if row is None:
        raise StoreError(f"query returned no row: {query.split()[0]}")
    return row[0]


def not_running(task_id: str, idx: int) -> Callable[[], Exception]:
    """The refusal of a write to a step that is not running (see :meth:`Session._refusal`)."""
    return lambda: StoreError(f"task {task_id!r} step {idx} is not running")


def around_attempt(data: dict[str, Any]) -> tuple[str, str]:
    """``dumps(data)`` cut around its ``attempt`` (given as 0), which canonical JSON
    puts first: the server writes the number it counts between the two halves."""
    head, text = '{"attempt":', dumps(data)
    if data.get("attempt") != 0 or not text.startswith(head + "0,"):
        raise ValueError(f"not a step_started with attempt 0 first: {text[:40]}")
    return head, text[len(head) + 1 :]


class Lease:
    """What this process knows of one lease it holds (mutable, guarded by a lock)."""

    __slots__ = ("lost", "owner", "run", "valid_until")

    def __init__(self, run: Run, owner: str, valid_until: float) -> None:
        self.run = run
        self.owner = owner
        self.valid_until = valid_until  # time.monotonic() before which it surely holds
        self.lost = False


class Heartbeat:
    """Renews a store's leases every ``interval`` seconds on a connection of its own."""

    def __init__(self, store: Session) -> None:
        self._store = store
        self._leases: dict[str, Lease] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ninelives-heartbeat", daemon=True)
        self._thread.start()

    def add(self, lease: Lease) -> None:
        with self._store._mutex:
            self._leases[lease.run.run_id] = lease

    def remove(self, run_id: str) -> None:
        with self._store._mutex:
            self._leases.pop(run_id, None)

    def stop(self) -> None:
        self._stop.set()
        # A renewal stuck on a cut link ends by the TCP timeout; never wait for it here.
        self._thread.join(timeout=1.0)

    def _loop(self) -> None:
        store = self._store
        conn: Conn | None = None
        # Holder locks this connection holds. The heartbeat holds them too, so
        # a holder whose main session died (terminated, a cut connection) while
        # its process lives and renews still shows as live to ``run``.
        locked: set[tuple[str, int]] = set()
        while not self._stop.wait(store.heartbeat):
            with store._mutex:
                leases = [lease for lease in self._leases.values() if not lease.lost]
            try:
                # A session the server ended while idle (a restart, an
                # idle_session_timeout shorter than the beat) is replaced before
                # the renewal, not found dead by it: a lost beat shortens the lease.
                if conn is None or conn.closed or conn.broken or store._ended_while_idle(conn):
                    if conn is not None:
                        conn.close()
                    locked = set()
                    conn = store._connect()
                self._unlock_ended(conn, locked, {(le.run.task_id, le.run.epoch) for le in leases})
                for lease in leases:
                    sent = time.monotonic()
                    cur = conn.execute(Q["renew"], store._lease_params(lease.run))
                    store._renewed(lease, sent, ok=cur.rowcount == 1)
                    key = (lease.run.task_id, lease.run.epoch)
                    if cur.rowcount == 1 and key not in locked:
                        if scalar(conn, Q["holder_lock"], {"id": key[0], "epoch": key[1]}):
                            locked.add(key)
            except (psycopg.Error, StoreError):
                if conn is not None:
                    conn.close()
                conn = None  # try again next beat; the lease may expire meanwhile
        if conn is not None:
            conn.close()

    @staticmethod
    def _unlock_ended(conn: Conn, locked: set[tuple[str, int]], held: set[tuple[str, int]]) -> None:
        for task_id, epoch in sorted(locked - held):
            conn.execute(Q["holder_unlock"], {"id": task_id, "epoch": epoch})
            locked.discard((task_id, epoch))


class Session:
    """One store's sessions: the runner's connection (made again, holder locks and
    all, when it breaks; never after close) and its transactions, the state set up
    by :class:`~ninelives.store.postgres.store.PostgresStore`."""

    dialect = "postgres"
    url: str
    lease: float
    heartbeat: float
    _readonly: bool
    _empty: bool
    _fencing: bool
    _scrub: Callable[[str], str]
    _shown: str
    _mutex: threading.Lock
    _leases: dict[str, Lease]
    _conn: Conn | None
    _pipe: psycopg.Pipeline | None
    _checks: list[Callable[[], None]]
    _refusals: list[Callable[[], Exception]]
    blobs: TableBlobs
    _closed = False

    # -- connections --------------------------------------------------------

    def _why(self, exc: BaseException) -> str:
        """A driver error as one line, without the password in any form."""
        return _say(exc, self._scrub)

    def _connect(self) -> Conn:
        lease_ms = int(self.lease * 1000)
        try:
            conn = psycopg.connect(
                self.url,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT,
                application_name="ninelives",
                # A request on a dead link fails after one lease instead of
                # TCP's quarter of an hour; an idle one is probed as often.
                tcp_user_timeout=max(lease_ms, 5000),
                keepalives=1,
                keepalives_idle=max(1, int(self.lease / 2)),
                keepalives_interval=max(1, int(self.lease / 4)),
                keepalives_count=3,
            )
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to {self._shown}: {self._why(exc)}") from exc
        try:
            # A runner stopped inside a transaction must not keep the task's row
            # locked forever: the server ends such a session.
            conn.execute(f"SET idle_in_transaction_session_timeout = {max(lease_ms, 5000)}")
            if self._readonly:  # the server itself refuses any write of this session
                conn.execute("SET default_transaction_read_only = on")
        except psycopg.Error as exc:
            conn.close()
            raise StoreError(f"cannot use {self._shown}: {self._why(exc)}") from exc
        return conn

    def _connection(self) -> Conn:
        """The runner's session, made again (holder locks and all) when it broke
        or when the server ended it while idle (:meth:`_ended_while_idle`)."""
        conn = self._conn
        if conn is None or conn.closed or conn.broken or self._ended_while_idle(conn):
            if self._closed:
                raise StoreError(f"database {self._shown} is closed")
            self._drop()
            conn = self._conn = self._connect()
            self._relock(conn)
        return conn

    def _relock(self, conn: Conn) -> None:
        """Take again, on a new session, the holder locks of the leases still held:
        the old session's died with it, and a free lock reads as a dead holder."""
        try:
            for lease in list(self._leases.values()):
                if not lease.lost:
                    conn.execute(Q["holder_lock"], self._lease_params(lease.run))
        except psycopg.Error as exc:
            self._drop()
            raise StoreError(f"cannot use {self._shown}: {self._why(exc)}") from exc

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass

    def _rollback(self, conn: Conn) -> None:
        try:
            conn.execute("ROLLBACK")
        except psycopg.Error:
            self._drop()

    # -- leases
    def _renewed(self, lease: Lease, sent: float, *, ok: bool) -> None:
        with self._mutex:
            if ok:
                lease.valid_until = max(lease.valid_until, sent + self.lease)
            else:
                lease.lost = True

    def _after_commit(self, run: Run, sent: float) -> None:
        """A fenced commit sent at ``sent`` renewed ``run``'s lease."""
        lease = self._leases.get(run.run_id)
        if lease is not None:
            self._renewed(lease, sent, ok=True)

    # -- the journal, the fence, the load ------------------------------------

    def lost(self, run: Run) -> LeaseLost:
        return LeaseLost(
            f"task {run.task_id!r} was taken over by another runner (epoch {run.epoch} "
            "is no longer current); this runner stops without writing"
        )

    def fence(self, conn: Conn, run: Run, status: TaskStatus) -> None:
        """The first statement of every fenced transaction; a closed fence is a
        refusal (:class:`LeaseLost`), so nothing after it is written."""
        params = {
            **self._lease_params(run),
            "status": status.value,
            "refusal": self.refusal(lambda: self.lost(run)),
        }
        conn.execute(Q["fence" if self._fencing else "fence_unchecked"], params)

    @staticmethod
    def journal_event(
        conn: Conn,
        task_id: str,
        run_id: str,
        kind: EventKind,
        step: int | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        conn.execute(
            Q["insert_event"],
            {"id": task_id, "run": run_id, "kind": kind.value, "step": step,
             "data": dumps(data or {})},
        )  # fmt: skip

    def load(self, conn: Conn, task_id: str, *, resolve: bool = True) -> Task:
        """The task and its steps; outputs stored as blobs read back (checked)
        unless ``resolve`` is False (rows as stored: escapes and references kept)."""
        # Both sent before either reply is read: one round trip in a pipeline.
        found = conn.execute(Q["get_task"], {"id": task_id})
        steps = conn.execute(Q["get_steps"], {"id": task_id})
        row = found.fetchone()
        if row is None:
            raise UnknownTask(f"unknown task {task_id!r}")
        task = Task.from_row(row, tuple(Step.from_row(task_id, r) for r in steps))
        return resolve_task(task, self.blobs.on(conn)) if resolve else task

    # -- transactions -------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[PostgresTransaction]:
        """One write transaction (:meth:`_write`) for the shared rules."""
        with self._write() as conn:
            yield PostgresTransaction(self, conn)

    def task_row(self, task_id: str) -> Any:
        """``get_task``'s row of a task, read on its own, for
        :class:`~ninelives.store.commits.CancelAware`."""
        with self._read() as conn:
            return conn.execute(Q["get_task"], {"id": task_id}).fetchone()

    def defer(self, check: Callable[[], None]) -> None:
        """Run ``check`` once the replies sent so far are in, before COMMIT."""
        self._checks.append(check)

    @contextmanager
    def _write(self) -> Iterator[Conn]:
        """One transaction, pipelined: statements are sent without waiting for
        each reply, and COMMIT goes in the same flush, so a fenced commit is one
        round trip. The fence and the other checks of a commit are refusals
        (:meth:`_refusal`), made by the server, which then skips the rest and
        the COMMIT; checks that need replies on the client are deferred to
        :meth:`_settle`, which runs before COMMIT or before any result is read
        and costs a round trip of its own."""
        conn = self._connection()
        committing = False
        self._checks = []
        self._refusals = []
        try:
            with conn.pipeline() as pipe:
                self._pipe = pipe
                conn.execute("BEGIN")
                yield conn
                self._settle()
                committing = True
                conn.execute("COMMIT")
            # leaving the pipeline waits for the COMMIT's reply
        except BaseException as exc:
            self._checks = []
            refused = self._refused(exc)
            # An error the server reported for a statement (a refusal, a
            # duplicate key, a read-only session) skipped the COMMIT, or the
            # COMMIT itself failed: nothing committed either way.
            known = refused is not None or rolled_back(exc, conn)
            if committing and not known:
                self._drop()  # whatever the session's state, it is not to be trusted
            else:
                self._rollback(conn)
            if refused is not None:
                raise refused from exc
            if isinstance(exc, pg_errors.UniqueViolation):
                raise
            if isinstance(exc, psycopg.Error):
                raise self._translate(exc, committing=committing and not known) from exc
            raise
        finally:
            self._pipe = None
            self._refusals = []

    def _one(self, name: str, params: dict[str, Any]) -> psycopg.Cursor[Any]:
        """Run the transition ``name`` of ``sql/postgres.sql``, fenced, as one
        statement that is its own transaction (autocommit): one round trip, and
        one message instead of BEGIN, the statements and COMMIT. Its checks are
        refusals (:meth:`_refusal`), registered by the caller just before."""
        fence = "fenced" if self._fencing else "fenced_unchecked"
        query = f"WITH fenced AS (\n{Q[fence]}\n),\n{Q[name]}"
        conn = self._connection()
        try:
            return conn.execute(query, params)
        except psycopg.Error as exc:
            refused = self._refused(exc)
            if refused is not None:
                raise refused from exc
            if not rolled_back(exc, conn):
                # No answer from the server: the statement may have committed.
                self._drop()
                raise self._translate(exc, committing=True) from exc
            raise self._translate(exc, committing=False) from exc  # an error: rolled back
        finally:
            self._refusals = []

    @staticmethod
    def _ended_while_idle(conn: Conn) -> bool:
        """Whether the server has closed this idle session (a restart, a terminated
        backend): its last words wait unread on the socket. Found before a
        statement, nothing was sent, so the statement goes on a new session (the
        fence still decides whether the lease is ours); found after sending, its
        outcome would be unknown. A session inside a transaction is not looked at."""
        if conn.pgconn.transaction_status != pq.TransactionStatus.IDLE:
            return False
        try:
            # libpq reads the server's FATAL while idle as a notice; the close
            # follows it, maybe a moment later: so once anything came unasked
            # (rare: a notice, a parameter change, those last words), wait a
            # little for more before trusting the session.
            for wait in (0.0, 0.1, 0.1):
                if not select.select([conn.pgconn.socket], [], [], wait)[0]:
                    break
                conn.pgconn.consume_input()
        except (OSError, psycopg.Error):
            return True
        return conn.pgconn.status != pq.ConnStatus.OK

    def refusal(self, make: Callable[[], Exception]) -> str:
        """A token for a statement of this transaction that the server fails
        when its check does not hold (a refusal: see ``fence`` in
        ``sql/postgres.sql``); the transaction then raises ``make()``."""
        self._refusals.append(make)
        return str(len(self._refusals) - 1)

    def _refused(self, exc: BaseException) -> Exception | None:
        """What the refusal reported by ``exc`` stands for; None if it is no refusal."""
        if not isinstance(exc, pg_errors.InvalidTextRepresentation):
            return None
        _, found, rest = (exc.diag.message_primary or "").partition(REFUSED)
        token = rest.split(":", 1)[0]
        if not found or not token.isdigit() or int(token) >= len(self._refusals):
            return None
        return self._refusals[int(token)]()

    def _settle(self) -> None:
        """Wait for the replies sent so far and run the deferred checks in order."""
        if not self._checks:
            return
        assert self._pipe is not None
        self._pipe.sync()
        checks, self._checks = self._checks, []
        for check in checks:
            check()

    def fetch(self, cur: psycopg.Cursor[Any]) -> Any:
        """``cur.fetchone()`` once the deferred checks (the fence) have passed."""
        self._settle()
        return cur.fetchone()

    def expect_one(self, cur: psycopg.Cursor[Any], error: str) -> None:
        """Defer: ``cur`` must have changed exactly one row, else StoreError(error)."""

        def check() -> None:
            if cur.rowcount != 1:
                raise StoreError(error)

        self._checks.append(check)

    def _translate(self, exc: psycopg.Error, *, committing: bool) -> Exception:
        if isinstance(exc, pg_errors.LockNotAvailable):
            return TaskBusy("the task is being committed by another live runner; try again")
        if committing:
            return unknown_outcome(f"commit to {self._shown}", self._why(exc))
        return StoreError(f"database {self._shown}: {self._why(exc)}")

    @contextmanager
    def _read(self) -> Iterator[Conn]:
        conn = self._connection()
        try:
            with conn.pipeline():
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                yield conn
                conn.execute("COMMIT")
        except BaseException as exc:
            self._rollback(conn)
            if isinstance(exc, psycopg.Error):
                raise StoreError(f"cannot read {self._shown}: {self._why(exc)}") from exc
            raise

    def _configure(self) -> None:
        steps = sql.migrations(self.dialect)
        latest = steps[-1][0]
        conn = self._connection()
        try:
            exists = conn.execute(Q["schema_exists"]).fetchone()
            version = conn.execute(Q["schema_version"]).fetchone() if exists and exists[0] else None
            theirs = [] if version else conn.execute(Q["contract_tables"]).fetchall()
        except psycopg.Error as exc:
            raise StoreError(f"cannot use {self._shown}: {self._why(exc)}") from exc
        if theirs:  # tables of ours by name, but no schema of ours: another application's
            raise StoreError(
                f"{self._shown} is not a ninelives database (it has a "
                f"{', '.join(r[0] for r in theirs)} table but no ninelives_schema); "
                "nothing was changed"
            )
        current = int(version[0]) if version else 0
        if current > latest:
            raise StoreError(
                f"database schema version {current} is newer than this ninelives ({latest})"
            )
        if self._readonly and not version:
            self._empty = True  # no ninelives schema yet: a database with no task
            return
        if current < latest and self._readonly:
            found = f"schema version {current}"
            raise StoreError(
                f"{self._shown} has {found}, this ninelives reads version {latest}: a command "
                "that writes (create, run, worker) migrates it; reading never does"
            )
        if current < latest:
            self._migrate(steps)

    def _migrate(self, steps: list[tuple[int, str, str]]) -> None:
        # DDL is transactional here: all of it commits, or none. The advisory
        # lock makes concurrent first starts (many workers) migrate once.
        with self._write() as conn:
            conn.execute(Q["migration_lock"])
            conn.execute(Q["schema_table"])
            row = conn.execute(Q["schema_version"]).fetchone()
            version = int(row[0]) if row else 0
            for number, name, path in steps:
                if number > version:
                    for statement in sql.statements(path):
                        conn.execute(statement)  # DDL without parameters: sent as is
                        # Executed by the server before the next is sent (a round
                        # trip per statement, once per migration), so a death here
                        # is a death mid-migration, which the server rolls back.
                        assert self._pipe is not None
                        self._pipe.sync()
                        crashpoints.crash("migration_statement", number)
                    conn.execute(Q["schema_applied"], {"version": number, "name": name})
            crashpoints.crash("migration_before_commit")

    def _lease_params(self, run: Run) -> dict[str, Any]:
        return {"id": run.task_id, "epoch": run.epoch, "lease": self.lease}


class PostgresTransaction(Journaling):
    """One pipelined write transaction of a :class:`Session`: the
    :class:`~ninelives.store.commits.Transaction` the shared rules commit
    through. The server's clock is ``now``; checks are deferred or refusals."""

    def __init__(self, session: Session, conn: Conn) -> None:
        self.session, self.conn = session, conn

    def run(self, query: str, params: dict[str, Any]) -> None:
        self.conn.execute(Q[query], params)

    def row(self, query: str, params: dict[str, Any]) -> Any:
        return self.session.fetch(self.conn.execute(Q[query], params))

    def rows(self, query: str, params: dict[str, Any]) -> list[Any]:
        return self.conn.execute(Q[query], params).fetchall()

    def changes_one(self, query: str, params: dict[str, Any], error: str) -> None:
        self.session.expect_one(self.conn.execute(Q[query], params), error)

    def load(self, task_id: str, *, resolve: bool = True) -> Task:
        return self.session.load(self.conn, task_id, resolve=resolve)

    def fence(self, run: Run, status: TaskStatus) -> None:
        self.session.fence(self.conn, run, status)

    def fence_cancelled(self, run: Run) -> None:
        session = self.session
        cur = self.conn.execute(Q["fence_cancelled"], {"id": run.task_id, "epoch": run.epoch})

        def check() -> None:
            if cur.rowcount != 1:
                raise session.lost(run)

        session.defer(check)

    def fenced_row(self, run: Run, query: str, params: dict[str, Any]) -> Any:
        # Not folded here: the fence is an UPDATE that renews the lease too.
        self.fence(run, TaskStatus.RUNNING)
        return self.row(query, params)

    def lock_task(self, task_id: str) -> None:
        if self.row("task_row_lock", {"id": task_id}) is None:
            raise UnknownTask(f"unknown task {task_id!r}")

    def lock_id(self, task_id: str) -> None:
        self.run("task_id_lock", {"id": task_id})

    def on_running_step(self, query: str, params: dict[str, Any]) -> None:
        refusal = self.session.refusal(not_running(params["id"], params["idx"]))
        self.run(query, {**params, "refusal": refusal})

    def stored_folder(self, folder: str | None) -> str | None:
        return folder if folder is None else check_folder_text(folder)
