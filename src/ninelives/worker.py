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
from typing import Any

from .errors import CommitUnknown, LeaseLost, NineLivesError, StoreError, TaskFailed
from .models import Run, TaskStatus
from .runtime import Runtime, check_queue, new_run_id
from .settings import Settings
from .store import Store, lease_settings, open_store
from .tools import Registry

#: How long a slot leaves alone a task it could not run (say, a tool missing on this host).
SKIP_SECONDS = 60.0


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
        env: dict[str, str] | None = None,
    ) -> WorkerOptions:
        """Arguments first, then ``NINELIVES_QUEUE``, ``NINELIVES_LEASE`` and
        ``NINELIVES_HEARTBEAT``, then the defaults; bad values are an InputError."""
        from .errors import InputError

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
            queue=check_queue(queue or env.get("NINELIVES_QUEUE") or "default"),
            concurrency=slots,
            lease=lease_s,
            heartbeat=beat,
            poll=wait,
            grace=stop_after,
            drain=drain,
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
    ) -> None:
        self.options = options
        self.settings = settings if settings is not None else Settings.from_env()
        if tools is None:
            from .tools.builtin import default_registry

            tools = default_registry(self.settings)
        self.tools = tools
        # Slots log from several threads: one line must never be split by another.
        self._log_lock = threading.Lock()
        self._log = self._serialized(log)
        self._step_log = self._serialized(step_log)
        self.name = f"{_hostname()}/{os.getpid()}"
        self._stopping = threading.Event()
        self._signals = 0
        self._current: dict[int, Run] = {}
        self._mutex = threading.Lock()

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
        """Run until stopped; returns the exit code (0 after a graceful stop).

        Opens every slot's store first, so a database that cannot be used is
        an error here (exit 5) rather than a slot that quietly dies.
        """
        # Handlers first: a signal while the stores connect stops the worker cleanly.
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            stores = [self._open() for _ in range(self.options.concurrency)]
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
            heartbeat=round(opts.heartbeat, 3), backend=getattr(stores[0], "dialect", "?"),
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
        self.note("-", "stopped")
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
        runtime = Runtime(store, settings=self.settings, tools=self.tools, log=self._step_log)
        skip: dict[str, float] = {}
        opts = self.options
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                for task_id in [t for t, until in skip.items() if until < now]:
                    del skip[task_id]
                try:
                    claimed = store.claim_next(opts.queue, new_run_id(), skip=list(skip))
                    if claimed is None:
                        if opts.drain and store.unfinished(opts.queue) == 0:
                            self.note(slot, "drained", queue=opts.queue)
                            return
                        self._stopping.wait(opts.poll * random.uniform(0.5, 1.0))
                        continue
                except StoreError as exc:
                    self.note(slot, "store_error", error=_one_line(exc))
                    self._stopping.wait(opts.poll)
                    continue
                self._execute(slot, runtime, store, *claimed, skip)
        finally:
            runtime.close()

    def _execute(self, slot: int, runtime: Runtime, store: Store, run: Run, task: Any,
                 skip: dict[str, float]) -> None:  # fmt: skip
        ids = {"task": run.task_id, "run": run.run_id, "epoch": run.epoch}
        self.note(slot, "claimed", **ids, recovered=list(run.recovered) or None)
        with self._mutex:
            self._current[slot] = run
        try:
            result = runtime.execute(run, task, stop=self._stopping.is_set)
        except LeaseLost:
            self.note(slot, "lease_lost", **ids)
        except TaskFailed as exc:
            self.note(slot, "failed", **ids, error=_one_line(exc))
        except CommitUnknown as exc:
            self.note(slot, "commit_unknown", **ids, error=_one_line(exc))
        except StoreError as exc:
            self.note(slot, "store_error", **ids, error=_one_line(exc))
        except NineLivesError as exc:
            # Not runnable here (a tool this host lacks, a bad stored plan):
            # leave it to other workers for a while rather than spin on it.
            skip[run.task_id] = time.monotonic() + SKIP_SECONDS
            self.note(slot, "cannot_run", **ids, error=_one_line(exc))
        except Exception as exc:  # a bug must not take the other slots down
            skip[run.task_id] = time.monotonic() + SKIP_SECONDS
            self.note(slot, "crashed", **ids, error=f"{type(exc).__name__}: {_one_line(exc)}")
        else:
            done = result.status is TaskStatus.DONE
            self.note(slot, "done" if done else "released", **ids, status=result.status.value)
        finally:
            with self._mutex:
                self._current.pop(slot, None)
            store.end_run(run)


def _hostname() -> str:
    import socket

    return socket.gethostname()


def _one_line(exc: BaseException) -> str:
    return repr(" ".join(str(exc).split()))
