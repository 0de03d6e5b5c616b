"""Workers: claim tasks from a queue, run them under a lease, stop gracefully.

``ninelives worker`` runs ``concurrency`` slots, each a thread with its own
store connection, looping claim -> run -> release:

* A claim takes the oldest unfinished task of the queue that no live runner
  holds (:meth:`~ninelives.store.Store.claim_next`): on PostgreSQL one whose
  lease is free or expired, with ``FOR UPDATE SKIP LOCKED``; on SQLite (one
  host) one whose kernel lock is free. Claiming recovers the steps a dead
  holder left ``running`` exactly as a restart does (``step_recovered``).
* The lease lasts ``lease`` seconds on the database's clock and is renewed by
  every commit and by a heartbeat every ``heartbeat`` seconds. A worker that
  stops renewing (SIGKILL, a pause, a cut link) loses its tasks at expiry.
  If it comes back, every commit it tries is fenced by the lease epoch: it
  logs ``action=lease_lost``, journals nothing and drops the task.
* SIGTERM or SIGINT: claim nothing more; each slot finishes the step it is in,
  releases its lease and ends; the process exits 0. Steps still running after
  ``grace`` seconds, or at a second signal, are given up: a new epoch fences
  them out, and the next claimer recovers them. SIGKILL is covered by expiry.
* A task this worker cannot run (a tool missing on this host, rows it cannot
  read) is refused before it is claimed, so nothing is written: the slot logs
  ``action=cannot_run`` or ``action=damaged`` and passes it over for
  ``SKIP_SECONDS``. With ``drain`` the worker ends once only such tasks are
  left, naming them (:class:`~ninelives.errors.TasksLeft`, exit 11).
* A task cancelled while a slot runs it (``ninelives cancel``) is released at
  the next step boundary, its step in flight committed: ``action=cancelled``;
  the slot goes on with other tasks.
* An I/O error that leaves a commit's outcome unknown stops the whole process
  at once, exactly as ``run`` does: the slot closes its connection and the
  process exits 6 without another write (no slot may commit after a failed
  write or sync of the same database); the next claimer recovers.

Each action is one line on stderr: ``worker=HOST/PID/SLOT action=NAME task=ID ...``.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from ..errors import (
    CommitUnknown,
    DamagedTask,
    LeaseLost,
    NineLivesError,
    PlanError,
    StoreError,
    TaskCancelled,
    TaskFailed,
    TaskParked,
    TasksLeft,
)
from ..models import Run, StepProgress, Task, TaskStatus
from ..names import check_queue, new_run_id
from ..settings import Settings, env_number
from ..store import Store, lease_settings, open_group_commit, open_store
from ..tools import Registry
from .core import Runtime

if TYPE_CHECKING:
    from ..store import GroupCommit

#: How long the worker leaves alone a task it could not run (say, a tool missing on this host).
SKIP_SECONDS = 60.0
#: The exit code of an unknown commit outcome (``cli.EXIT_CODES`` for CommitUnknown;
#: a test keeps them equal). The worker leaves with it from whichever slot hit it.
EXIT_OUTCOME_UNKNOWN = 6


class _CannotRun(NineLivesError):
    """A task refused before its claim (a tool this host lacks), with its id."""

    def __init__(self, task_id: str, reason: str) -> None:
        super().__init__(reason)
        self.task_id = task_id


@dataclass(frozen=True, kw_only=True)
class WorkerOptions:
    """How a worker claims and holds tasks. Build with :meth:`from_env`."""

    url: str
    queue: str = "default"
    concurrency: int = 1
    lease: float = 30.0
    heartbeat: float = 10.0
    poll: float = 1.0
    grace: float = 30.0
    drain: bool = False
    #: Commit the slots' transitions in batches (SQLite only; :mod:`.store.sqlite.group`).
    group_commit: bool = False
    #: The longest a transition waits for others to join its batch, in seconds.
    group_linger: float = 0.002

    @classmethod
    def from_env(
        cls,
        url: str,
        *,
        queue: str | None = None,
        concurrency: int | None = None,
        lease: float | None = None,
        heartbeat: float | None = None,
        poll: float | None = None,
        grace: float | None = None,
        drain: bool = False,
        group_commit: bool | None = None,
        group_linger_ms: float | None = None,
        env: dict[str, str] | None = None,
    ) -> WorkerOptions:
        """Arguments first, then ``NINELIVES_QUEUE``, ``NINELIVES_LEASE``,
        ``NINELIVES_HEARTBEAT``, ``NINELIVES_GROUP_COMMIT`` (``1`` or ``0``) and
        ``NINELIVES_GROUP_COMMIT_LINGER_MS``, then the defaults; bad values are
        an InputError."""
        from ..errors import InputError

        env = dict(os.environ) if env is None else env
        lease_s, beat = lease_settings(env, lease=lease, heartbeat=heartbeat)
        slots = 1 if concurrency is None else concurrency
        if not 1 <= slots <= 256:
            raise InputError(f"--concurrency must be 1-256, got {slots}")
        wait = 1.0 if poll is None else poll
        if not 0.01 <= wait <= 3600:
            raise InputError(f"--poll must be 0.01-3600 seconds, got {wait!r}")
        stop_after = 30.0 if grace is None else grace
        if not 0 <= stop_after <= 86400:
            raise InputError(f"--grace must be 0-86400 seconds, got {stop_after!r}")
        return cls(
            url=url,
            # An empty --queue is checked as given (refused), never taken for
            # no queue: a worker would take another queue's tasks.
            queue=check_queue(
                queue if queue is not None else env.get("NINELIVES_QUEUE") or "default"
            ),
            concurrency=slots,
            lease=lease_s,
            heartbeat=beat,
            poll=wait,
            grace=stop_after,
            drain=drain,
            **_group_options(env, group_commit, group_linger_ms),
        )


class Worker:
    """Slots that claim and run tasks until stopped (or, with ``drain``, until
    the queue has no unfinished task)."""

    def __init__(
        self,
        options: WorkerOptions,
        *,
        settings: Settings | None = None,
        tools: Registry | None = None,
        log: Callable[[str], None] | None = None,
        step_log: Callable[[str], None] | None = None,
        on_progress: Callable[[StepProgress], None] | None = None,
    ) -> None:
        self.options = options
        self.settings = settings if settings is not None else Settings.from_env()
        if tools is None:
            from ..tools.builtin import default_registry

            tools = default_registry(self.settings)
        self.tools = tools
        # Slots log from several threads: one line must never be split by another.
        self._log_lock = threading.Lock()
        self._log = self._serialized(log)
        self._step_log = self._serialized(step_log)
        self._on_progress = on_progress  # the sink serializes itself (see cli.bar)
        self.name = f"{_hostname()}/{os.getpid()}"
        self._stopping = threading.Event()
        self._signals = 0
        self._current: dict[int, Run] = {}
        self._mutex = threading.Lock()
        # Tasks this worker could not run: id -> (retry after, reason). Shared by
        # the slots, so one refusal spares the others the same attempt.
        self._unrunnable: dict[str, tuple[float, str]] = {}
        self._drained = 0

    # -- logging ------------------------------------------------------------

    def _serialized(self, log: Callable[[str], None] | None) -> Callable[[str], None] | None:
        if log is None:
            return None

        def locked(line: str) -> None:
            with self._log_lock:
                log(line)

        return locked

    def note(self, slot: int | str, action: str, **fields: Any) -> None:
        """One structured line: ``worker=NAME/SLOT action=ACTION key=value ...``."""
        if self._log is None:
            return
        tail = "".join(f" {key}={value}" for key, value in fields.items() if value is not None)
        self._log(f"worker={self.name}/{slot} action={action}{tail}")

    # -- the process --------------------------------------------------------

    def run(self) -> int:
        """Run until stopped or drained; returns 0 after a graceful stop or a full drain.

        Opens every slot's store first, so a database that cannot be used is
        an error here (exit 5) rather than a slot that quietly dies. Raises
        :class:`~ninelives.errors.TasksLeft` when a drain ends with tasks this
        worker could not run, and :class:`~ninelives.errors.StoreError` if every
        slot ended for another reason: a worker never ends "successfully" by
        itself. An unknown commit outcome ends the process (exit 6, see above).
        """
        # Handlers first: a signal while the stores connect stops the worker cleanly.
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            stores = [self._open() for _ in range(self.options.concurrency)]
            group = self._group(stores)
        except BaseException:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            raise
        threads = [
            threading.Thread(target=self._slot, args=(i, store), name=f"ninelives-slot-{i}")
            for i, store in enumerate(stores)
        ]
        opts = self.options
        self.note(
            "-", "started", queue=opts.queue, slots=opts.concurrency, lease=opts.lease,
            heartbeat=round(opts.heartbeat, 3), backend=stores[0].dialect,
            group_commit=None if group is None else f"{opts.group_linger * 1000:g}ms",
        )  # fmt: skip
        deadline: float | None = None
        try:
            for thread in threads:
                thread.start()
            while any(t.is_alive() for t in threads):
                for thread in threads:
                    thread.join(timeout=0.1)
                if self._stopping.is_set() and deadline is None:
                    deadline = time.monotonic() + opts.grace
                if deadline is not None and (self._signals > 1 or time.monotonic() > deadline):
                    self._abandon()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if group is not None:
                group.close()  # every slot has ended: nothing is left to commit
        return self._outcome()

    def _group(self, stores: list[Store]) -> GroupCommit | None:
        """With ``group_commit``: one committer all the slots write through
        (:func:`~ninelives.store.open_group_commit`); a backend without it (PostgreSQL
        shares its WAL flushes already) logs the option as off."""
        if not self.options.group_commit:
            return None
        group = open_group_commit(stores, self._open, linger=self.options.group_linger)
        if group is None:
            self.note("-", "group_commit_off", reason="sqlite_only")
        return group

    def _outcome(self) -> int:
        """Why every slot ended: asked to stop, drained, or neither (an error)."""
        if self._stopping.is_set():
            self.note("-", "stopped")
            return 0
        if self._drained < self.options.concurrency:
            self.note("-", "stopped", reason="slots_ended")
            raise StoreError(
                f"{self.options.concurrency - self._drained} worker slot(s) ended unexpectedly "
                "(see the log above); the worker stopped"
            )
        with self._mutex:
            left = sorted(self._unrunnable.items())
        self.note("-", "stopped", left=len(left) or None)
        if left:
            named = "; ".join(f"{task_id}: {reason}" for task_id, (_, reason) in left)
            raise TasksLeft(
                f"queue {self.options.queue!r} drained except {len(left)} task(s) this "
                f"worker could not run: {named}"
            )
        return 0

    def stop(self) -> None:
        """Ask every slot to finish its current step and end (what SIGTERM does)."""
        self._stopping.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        self._stopping.set()
        if self._signals == 1:
            self.note("-", "stopping", signal=signal.Signals(signum).name, grace=self.options.grace)

    def _open(self) -> Store:
        return open_store(
            self.options.url, lease=self.options.lease, heartbeat=self.options.heartbeat
        )

    def _abandon(self) -> None:
        """Give up the steps still running, then leave at once (exit 0)."""
        with self._mutex:
            held = list(self._current.items())
        if held:
            try:
                store = self._open()
                for slot, run in held:
                    store.abandon_run(run)
                    self.note(slot, "abandoned", task=run.task_id, run=run.run_id, epoch=run.epoch)
            except NineLivesError as exc:
                self.note("-", "abandon_failed", error=_one_line(exc))  # leases expire anyway
        self.note("-", "stopped")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # the slots may be inside a tool; threads cannot be interrupted

    # -- one slot -----------------------------------------------------------

    def _slot(self, slot: int, store: Store) -> None:
        runtime = Runtime(
            store, settings=self.settings, tools=self.tools, log=self._step_log,
            on_progress=self._on_progress,
        )  # fmt: skip
        try:
            while not self._stopping.is_set():
                claimed = self._claim(slot, runtime, store)
                if claimed is None:
                    if self.options.drain and self._is_drained(store):
                        self.note(slot, "drained", queue=self.options.queue)
                        with self._mutex:
                            self._drained += 1
                        return
                    self._stopping.wait(self.options.poll * random.uniform(0.5, 1.0))
                    continue
                if isinstance(claimed, tuple):
                    self._execute(slot, runtime, store, *claimed)
        except BaseException as exc:
            # Not re-raised: the thread would print a traceback; the log line and
            # the worker's exit status (5, not 0) say it instead.
            self.note(slot, "slot_ended", error=f"{type(exc).__name__}: {_one_line(exc)}")
        finally:
            runtime.close()

    def _claim(self, slot: int, runtime: Runtime, store: Store) -> tuple[Run, Task] | bool | None:
        """Claim the next task: the claim, None when there is none to claim, or
        False after a task was refused or an error logged (look again soon)."""

        def check(task: Task) -> None:
            try:
                runtime.resolve_tools(task)
                runtime.refuse_unstorable()
            except (PlanError, StoreError) as exc:
                raise _CannotRun(task.id, str(exc)) from None

        try:
            return store.claim_next(
                self.options.queue, new_run_id(), skip=self._skipped(), check=check,
                max_recoveries=self.settings.max_recoveries, on_unknown=runtime.unknown_modes(),
            )  # fmt: skip
        except (_CannotRun, DamagedTask) as exc:
            self._refuse(slot, exc.task_id, exc)
            return False
        except CommitUnknown as exc:
            self._fail_stop(slot, store, exc)
        except StoreError as exc:
            self.note(slot, "store_error", error=_one_line(exc))
        except Exception as exc:  # a bug must not take the slot down
            self.note(slot, "crashed", error=f"{type(exc).__name__}: {_one_line(exc)}")
        self._stopping.wait(self.options.poll)
        return False

    def _skipped(self) -> list[str]:
        """Tasks refused less than SKIP_SECONDS ago: passed over by every slot."""
        now = time.monotonic()
        with self._mutex:
            return [t for t, (until, _) in self._unrunnable.items() if until > now]

    def _refuse(self, slot: int | str, task_id: str, exc: Exception) -> None:
        action = "damaged" if isinstance(exc, DamagedTask) else "cannot_run"
        with self._mutex:
            self._unrunnable[task_id] = (time.monotonic() + SKIP_SECONDS, str(exc))
        self.note(slot, action, task=task_id, error=_one_line(exc))

    def _is_drained(self, store: Store) -> bool:
        """Nothing left to claim but the tasks this worker cannot run."""
        with self._mutex:
            refused = list(self._unrunnable)
        try:
            if store.unfinished(self.options.queue, skip=refused) != 0:
                return False
            # Forget the refused tasks that someone else has finished meanwhile.
            for task_id in refused:
                if not self._still_unfinished(store, task_id, refused):
                    with self._mutex:
                        self._unrunnable.pop(task_id, None)
        except StoreError as exc:
            self.note("-", "store_error", error=_one_line(exc))
            return False
        return True

    def _still_unfinished(self, store: Store, task_id: str, refused: list[str]) -> bool:
        # Asked of the count that found the queue drained, with this task no
        # longer left out: it also finds a task that no read by id reaches
        # (an id that is not UTF-8, refused under its escaped name).
        others = [t for t in refused if t != task_id]
        return store.unfinished(self.options.queue, skip=others) > 0

    def _fail_stop(self, slot: int, store: Store, exc: CommitUnknown) -> NoReturn:
        """Stop the process now, like ``run``: no slot writes again after a commit
        (or an effect's fsync) whose outcome is unknown. The lock dies with the
        process; the next claimer recovers whatever is left running."""
        self.note(slot, "commit_unknown", error=_one_line(exc))
        try:
            store.close()
        except Exception:  # leaving anyway
            pass
        try:
            print(f"ninelives: error: {exc}", file=sys.stderr, flush=True)
            sys.stdout.flush()
        except OSError:
            pass
        os._exit(EXIT_OUTCOME_UNKNOWN)  # the other slots may be inside a tool

    def _execute(self, slot: int, runtime: Runtime, store: Store, run: Run, task: Task) -> None:
        ids = {"task": run.task_id, "run": run.run_id, "epoch": run.epoch}
        self.note(slot, "claimed", **ids, recovered=list(run.recovered) or None)
        with self._mutex:
            self._current[slot] = run
            self._unrunnable.pop(run.task_id, None)
        try:
            # A backoff longer than a poll is not slept in the slot: the task is
            # released, and the claim passes it over until it is due.
            result = runtime.execute(
                run, task, stop=self._stopping.is_set, max_wait=self.options.poll
            )
        except LeaseLost:
            self.note(slot, "lease_lost", **ids)
        except TaskFailed as exc:
            self.note(slot, "failed", **ids, error=_one_line(exc))
        except TaskCancelled:
            # Stopped at the step boundary; the lease is released below and the
            # slot goes on with other tasks (workers never claim a cancelled one).
            self.note(slot, "cancelled", **ids)
        except TaskParked as exc:
            # Waits for a person: no longer claimable, so the worker goes on with
            # other tasks and takes this one again once resolved or approved.
            self.note(slot, "parked", **ids, error=_one_line(exc))
        except CommitUnknown as exc:
            with self._mutex:
                self._current.pop(slot, None)
            self._fail_stop(slot, store, exc)
        except StoreError as exc:
            self.note(slot, "store_error", **ids, error=_one_line(exc))
        except NineLivesError as exc:
            # Not runnable here after all (a bad stored input, say): leave it
            # to other workers for a while rather than spin on it.
            self._refuse(slot, run.task_id, exc)
        except Exception as exc:  # a bug must not take the other slots down
            self._refuse(slot, run.task_id, exc)
            self.note(slot, "crashed", **ids, error=f"{type(exc).__name__}: {_one_line(exc)}")
        else:
            done = result.status is TaskStatus.DONE
            self.note(slot, "done" if done else "released", **ids, status=result.status.value)
        finally:
            with self._mutex:
                self._current.pop(slot, None)
            store.end_run(run)


def _group_options(env: dict[str, str], on: bool | None, linger_ms: float | None) -> dict[str, Any]:
    from ..errors import InputError

    if on is None:
        flag = env.get("NINELIVES_GROUP_COMMIT", "0").strip().lower()
        if flag not in ("", "0", "1", "false", "true", "no", "yes", "off", "on"):
            raise InputError(f"NINELIVES_GROUP_COMMIT must be 1 or 0, got {flag!r}")
        on = flag in ("1", "true", "yes", "on")
    if linger_ms is None:
        linger_ms = env_number(
            env, "NINELIVES_GROUP_COMMIT_LINGER_MS", 2.0, float, minimum=0, maximum=1000
        )
    elif not 0 <= linger_ms <= 1000:
        raise InputError(f"--group-commit-linger-ms must be 0-1000, got {linger_ms!r}")
    return {"group_commit": on, "group_linger": linger_ms / 1000}


def _hostname() -> str:
    import socket

    return socket.gethostname()


def _one_line(exc: BaseException) -> str:
    return repr(" ".join(str(exc).split()))
