"""Helpers of the worker tests: worker processes with their logs, and journal checks."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ninelives.journal import CLOSING_KINDS, invariant_violations
from ninelives.models import Event
from ninelives.store import Store, open_store
from ninelives.testing import Lab

SUMMARY = "Line one\nLine two\nLine three"  # the stub summary of the lab's notes
_FIELD = re.compile(r"(\w+)=(\S+)")


@dataclass
class Worker:
    """One ``ninelives worker`` process, its stderr in a file."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def actions(self, action: str | None = None) -> list[dict[str, str]]:
        """The worker's structured log lines as dicts (only ``action`` ones if given)."""
        rows = []
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        for line in text.splitlines():
            if line.startswith("worker=") and " action=" in line:
                row = dict(_FIELD.findall(line))
                if action is None or row.get("action") == action:
                    rows.append(row)
        return rows

    def wait_for(self, action: str, timeout: float = 30) -> None:
        """Until the worker has logged ``action`` (say ``started``: signals are handled)."""
        deadline = time.monotonic() + timeout
        while not self.actions(action):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"{self.name} never logged {action}: {self.log()}")
            time.sleep(0.02)

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout=timeout)


@dataclass
class Fleet:
    """Worker processes on one lab's database, all killed at teardown."""

    lab: Lab
    workers: list[Worker] = field(default_factory=list)
    _store: Store | None = None
    _count: int = 0

    @property
    def store(self) -> Store:
        """An in-process store on the lab's database, for setup and checks."""
        if self._store is None:
            db = self.lab.db
            url = db if "://" in db else str(self.lab.root / db)
            self._store = open_store(url)
        return self._store

    def start(
        self,
        *flags: str,
        name: str | None = None,
        db: str | None = None,
        wrap: Sequence[str] = (),
        **env: str,
    ) -> Worker:
        """Start ``ninelives worker FLAGS`` with extra environment ``env``; ``db``
        overrides the lab's database URL, ``wrap`` prefixes the command line
        (``ip netns exec NS``)."""
        self._count += 1
        name = name or f"w{self._count}"
        log_path = self.lab.root / f"{name}.{self._count}.log"
        argv = [*self.lab.command, "--db", db or self.lab.db, "worker", *flags]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [*wrap, *argv],
                cwd=self.lab.root,
                env=self.lab.env(env),
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,  # a signal meant for the test runner never reaches it
            )
        worker = Worker(name=name, proc=proc, log_path=log_path)
        self.workers.append(worker)
        return worker

    def close(self) -> None:
        """SIGKILL every worker still running (a SIGSTOPped one too) and close the store."""
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.proc.send_signal(signal.SIGKILL)
            worker.proc.wait(timeout=30)
        if self._store is not None:
            self._store.close()
            self._store = None

    def events(self, task_id: str) -> list[Event]:
        return self.store.events(task_id)

    def wait_events(
        self, task_id: str, pred: Callable[[list[Event]], bool], timeout: float = 30
    ) -> list[Event]:
        """Poll the journal until ``pred(events)`` holds."""
        deadline = time.monotonic() + timeout
        while True:
            events = self.events(task_id)
            if pred(events):
                return events
            if time.monotonic() > deadline:
                kinds = [(e.seq, e.kind, e.step_idx, e.run_id[:6]) for e in events]
                logs = "\n".join(w.log()[-2000:] for w in self.workers)
                raise AssertionError(f"timed out on {task_id}; journal {kinds}\n{logs}")
            time.sleep(0.05)


def has(kind: str, step: int | None = None, count: int = 1) -> Callable[[list[Event]], bool]:
    """A journal predicate: at least ``count`` events of ``kind`` (for ``step``)."""

    def pred(events: list[Event]) -> bool:
        found = [e for e in events if e.kind == kind and (step is None or e.step_idx == step)]
        return len(found) >= count

    return pred


def journal_problems(events: Iterable[Event]) -> list[str]:
    """The invariant, plus fencing seen from the journal: every event a run wrote
    lies between its own ``run_started`` and the next run's, so no runner wrote
    after another had taken the task over."""
    events = list(events)
    problems = invariant_violations(events)
    started = sum(e.kind == "step_started" for e in events)
    closed = sum(e.kind in CLOSING_KINDS for e in events)
    if started != closed:
        problems.append(f"{started} step_started != {closed} closing events")
    current: str | None = None
    recovering: list[Event] = []  # step_recovered precede their run's run_started
    for event in events:
        if event.kind == "task_created":
            continue
        if event.kind == "step_recovered":
            recovering.append(event)
        elif event.kind == "run_started":
            current = event.run_id
            strays = [e.seq for e in recovering if e.run_id != current]
            if strays:
                problems.append(f"step_recovered at seq {strays} not by the run that started")
            recovering.clear()
        elif event.run_id != current:
            problems.append(
                f"seq {event.seq} {event.kind} by run {event.run_id[:8]} after run "
                f"{(current or '?')[:8]} had taken the task"
            )
    if sum(e.kind == "task_done" for e in events) > 1:
        problems.append("task_done more than once")
    return problems


def expected_artifacts(*task_ids: str) -> dict[str, str]:
    """What the artifacts folder must hold once the guide plan ran for these tasks."""
    return {f"{task_id}-2.md": SUMMARY for task_id in task_ids}


def run_ids(events: Iterable[Event]) -> list[str]:
    return [e.run_id for e in events if e.kind == "run_started"]
