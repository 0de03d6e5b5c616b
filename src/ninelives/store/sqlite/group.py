"""Group commit on SQLite: the writes of several tasks in one transaction.

A worker with many slots on one SQLite file pays one fsync per transition
per slot, and the slots queue for the single write lock: 16 slots commit no
faster than one. With group commit (``ninelives worker --group-commit``),
the slots' stores hand their writes to one :class:`GroupCommitter`, which
owns one connection of its own:

* The first write of a batch opens ``BEGIN IMMEDIATE`` on that connection;
  each write (the body of a store's ``_write()``) then runs in the caller's
  thread, one at a time, inside its own ``SAVEPOINT``. A write that raises
  (a fenced epoch, a step not pending, a constraint) is rolled back to its
  savepoint and fails its own caller only; the others stay in the batch.
* The batch commits once every attached slot has a write in it, or once it
  holds ``max_batch`` writes (the write that fills it commits it), or
  ``linger`` seconds after it was opened (a committer thread commits it),
  whichever comes first: a write waits at most ``linger`` (plus the commit
  itself) for writes of other tasks to join it.
* Then it wakes every caller of the batch with the batch's outcome.

The safety argument is the ordering in :meth:`GroupCommitter.write`: a
caller does not return from its write, and so does not run a tool's effect
or issue its next transition, until the COMMIT that holds its write has
returned, which with ``synchronous=FULL`` means the WAL is fsynced. The
store's journal then says no less than it did with a commit per write: only
the moment of the fsync moves, never past the return to the caller. A task
waits for each commit before it issues the next, so each task's transitions
keep their order.

An I/O error (an outcome unknown) in any write or in the COMMIT fails every
write of the batch with :class:`~ninelives.errors.CommitUnknown`, and every
later write too: nothing is written after a failed write or sync of the
same file, exactly as a store on its own stops (the worker exits 6).

Reads stay on each store's own connection and so see committed rows only.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...errors import CommitUnknown, StoreError

if TYPE_CHECKING:
    from .base import SQLiteBase

#: Default linger: how long a batch waits for more writes once opened.
DEFAULT_LINGER = 0.002
#: Default batch size at which a batch commits without waiting for the linger.
DEFAULT_MAX_BATCH = 256
_UNSAFE_PREFIX = "unsafe-test-only:"


def early_release(path: str, env: dict[str, str] | None = None) -> bool:
    """True only in the negative-control test that shows why callers wait.

    TEST-ONLY, thrown like :func:`ninelives.store.fencing_disabled`:
    ``NINELIVES_TEST_GROUP_EARLY_RELEASE`` must hold ``unsafe-test-only:``
    followed by this very SQLite path. Callers are then released as soon as
    their write is in the batch, before the COMMIT: a kill before the commit
    loses transitions whose effects have already run.
    """
    env = dict(os.environ) if env is None else env
    value = env.get("NINELIVES_TEST_GROUP_EARLY_RELEASE", "")
    return bool(value) and value in (
        _UNSAFE_PREFIX + path,
        _UNSAFE_PREFIX + os.path.realpath(path),
    )


@dataclass(eq=False)
class _Batch:
    """One open transaction and the callers waiting for its commit."""

    opened: float
    members: int = 0
    #: Set when the batch can no longer commit: every member gets this error.
    poison: BaseException | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True, kw_only=True)
class GroupStats:
    """What the committer did: for tests and the bench."""

    batches: int
    writes: int
    failed_writes: int


class GroupCommitter:
    """One connection that commits the writes of several stores together.

    ``carrier`` is a store of its own on the same file (its connection is
    configured, WAL and ``synchronous=FULL``); it is closed with the
    committer. Thread-safe: that is its point.
    """

    def __init__(
        self,
        carrier: SQLiteBase,
        *,
        linger: float = DEFAULT_LINGER,
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> None:
        if not 0 <= linger <= 1:
            raise ValueError(f"linger must be 0-1 seconds, got {linger!r}")
        self.carrier = carrier
        self.linger = linger
        self.max_batch = max(1, max_batch)
        self._cond = threading.Condition()
        self._batch: _Batch | None = None
        self._parties = 0
        self._broken: BaseException | None = None
        self._closed = False
        self._batches = self._writes = self._failed = 0
        self._early = early_release(carrier.path)
        if self._early:
            import sys

            warning = f"ninelives: WARNING: group commit releases callers EARLY for {carrier.url}"
            print(f"{warning} (test-only switch)", file=sys.stderr)
        self._thread = threading.Thread(
            target=self._commit_loop, name="ninelives-group-commit", daemon=True
        )
        self._thread.start()

    # -- membership ---------------------------------------------------------

    def attach(self) -> None:
        """One more store writes through this committer (a worker slot)."""
        with self._cond:
            self._parties += 1

    def detach(self) -> None:
        """A store that wrote through this committer closed."""
        with self._cond:
            self._parties = max(0, self._parties - 1)
            self._cond.notify_all()

    def stats(self) -> GroupStats:
        """Batches committed, writes in them, and writes that failed alone."""
        with self._cond:
            return GroupStats(
                batches=self._batches, writes=self._writes, failed_writes=self._failed
            )

    # -- a write ------------------------------------------------------------

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """The body of one store write, in the open batch under its own savepoint.

        Returns (leaves the ``with``) only once the batch holding the write is
        committed: see the module docstring for why that order is the safety
        argument. Raises what the body raised (its savepoint rolled back, the
        batch unharmed), or the batch's error when the batch did not commit.
        """
        conn = self.carrier._conn
        with self._cond:
            batch = self._join()
            try:
                conn.execute("SAVEPOINT ninelives_write")
            except sqlite3.Error as exc:
                raise self._poison(batch, exc) from exc
            try:
                yield conn
            except BaseException as exc:
                self._undo(batch, conn, exc)
                self._failed += 1
                if isinstance(exc, sqlite3.Error) and not isinstance(exc, sqlite3.IntegrityError):
                    raise self.carrier._translate(exc) from exc
                raise
            try:
                conn.execute("RELEASE ninelives_write")
            except sqlite3.Error as exc:
                raise self._poison(batch, exc) from exc
            batch.members += 1
            if self._early:
                pass  # the negative control leaves every commit to the committer
            elif batch.members >= min(self.max_batch, max(1, self._parties)):
                # Everyone who could join has: the last one in commits, which
                # spares two thread switches per batch (one slot: every write).
                self._finish(batch)
        if self._early:
            return  # the negative control's unsafe order: no wait for the COMMIT
        # No lock held here: the committer commits while callers wait. The
        # caller's tool runs only after this wait: the write is durable first.
        batch.done.wait()
        if batch.error is not None:
            raise batch.error

    def _join(self) -> _Batch:
        """The open batch, opening one (BEGIN IMMEDIATE) if none is; under the lock."""
        if self._broken is not None:
            raise _unknown(self._broken)
        if self._closed:
            raise StoreError("the group committer is closed")
        if self._batch is not None:
            return self._batch
        conn = self.carrier._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot start a write on {self.carrier.url}: {exc}") from exc
        batch = _Batch(opened=time.monotonic())
        try:
            if not self.carrier._folder_synced:
                self.carrier._sync_folder()
        except BaseException as exc:
            self._batch = batch
            raise self._poison(batch, exc) from None
        self._batch = batch
        self._cond.notify_all()
        return batch

    def _undo(self, batch: _Batch, conn: sqlite3.Connection, exc: BaseException) -> None:
        """Roll one failed write back to its savepoint; poison the batch when
        that is not possible or the failure leaves the outcome unknown."""
        unknown = isinstance(exc, CommitUnknown) or (
            isinstance(exc, sqlite3.Error)
            and isinstance(self.carrier._translate(exc), CommitUnknown)
        )
        try:
            conn.execute("ROLLBACK TO ninelives_write")
            conn.execute("RELEASE ninelives_write")
        except BaseException:  # the write already failed: its own error is raised
            unknown = True
        if unknown or not conn.in_transaction:
            # SQLite may have rolled back the whole transaction (a full disk,
            # an I/O error): the other members' writes are gone with it.
            self._poison(batch, exc)

    def _poison(self, batch: _Batch, exc: BaseException) -> CommitUnknown:
        """The batch cannot commit: it and every later write fail (exit 6)."""
        error = _unknown(exc)
        batch.poison = error
        self._broken = self._broken or error
        self._cond.notify_all()
        return error

    # -- the committer ------------------------------------------------------

    def _commit_loop(self) -> None:
        with self._cond:
            while True:
                batch = self._batch
                if batch is None:
                    if self._closed:
                        return
                    self._cond.wait()
                    continue
                left = batch.opened + self.linger - time.monotonic()
                # The negative control commits on the linger alone, so that the
                # window in which released callers run ahead of the commit is wide.
                full = not self._early and batch.members >= min(
                    self.max_batch, max(1, self._parties)
                )
                if left > 0 and not full and batch.poison is None and not self._closed:
                    self._cond.wait(left)
                    continue
                self._finish(batch)

    def _finish(self, batch: _Batch) -> None:
        """COMMIT (or, poisoned, ROLLBACK) the batch and wake its callers; under the lock."""
        conn = self.carrier._conn
        try:
            if batch.poison is not None:
                batch.error = batch.poison
                _rollback(conn)
            else:
                try:
                    conn.execute("COMMIT")
                except sqlite3.Error as exc:
                    _rollback(conn)
                    error = self.carrier._translate(exc)
                    if isinstance(error, CommitUnknown):
                        self._broken = self._broken or error
                    batch.error = error
                except BaseException as exc:  # nobody may think it committed
                    _rollback(conn)
                    unknown = self._poison(batch, exc)
                    # A BaseException (a simulated power cut) reaches the
                    # callers as itself; anything else as the unknown outcome.
                    batch.error = unknown if isinstance(exc, Exception) else exc
                else:
                    self._batches += 1
                    self._writes += batch.members
        finally:
            self._batch = None
            batch.done.set()
            self._cond.notify_all()

    def close(self) -> None:
        """Commit what is open, stop the committer thread, close the connection."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        self.carrier.close()


def _rollback(conn: sqlite3.Connection) -> None:
    # Only ever after a failure, whose error the callers get: nothing raised
    # here may replace it or end the committer thread.
    try:
        conn.execute("ROLLBACK")
    except BaseException:
        pass  # already rolled back by SQLite, or the connection is gone


def _unknown(exc: BaseException) -> CommitUnknown:
    if isinstance(exc, CommitUnknown):
        return exc
    return CommitUnknown(
        f"a grouped write failed ({type(exc).__name__}: {exc}); the outcome of its batch "
        "is unknown, stopping now: the next run recovers"
    )
