"""The runs a torture session kills: one lane of tasks per worker thread.

A :class:`Session` holds what every run shares (the ``ninelives`` command,
its environment, the database); each :class:`Lane` creates tasks, runs them
with that command and SIGKILLs the runs at seeded moments (:func:`_kill`),
noting what the database acknowledged done between kills.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..errors import StoreError, TaskFailed
from ..models import EventKind, StepStatus, Task
from ..verify import read_consistent

DB_NAME = "state.db"
ARTIFACTS_NAME = "artifacts"


@dataclass
class Lane:
    """One worker's tasks and tallies (touched by its own thread only)."""

    number: int
    quota: int
    rng: random.Random
    kills: int = 0
    runs: int = 0
    tasks: list[str] = field(default_factory=list)
    observed: dict[str, dict[int, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


class Session:
    """What every run of one session shares: the command, its environment, the folder."""

    def __init__(
        self,
        subject: Sequence[str],
        folder: str,
        env: Mapping[str, str] | None,
        log: Callable[[str], None] | None,
        pause: float,
    ) -> None:
        #: What follows ``create TASK``: the plan file, or ``--workflow NAME --args JSON``.
        self.subject = tuple(subject)
        self.folder = folder
        self.db = os.path.join(folder, DB_NAME)
        self.artifacts = os.path.join(folder, ARTIFACTS_NAME)
        base = {k: v for k, v in os.environ.items() if k not in ("AGENT_CRASH_AT", "NINELIVES_DB")}
        base.update(env or {})
        base.pop("AGENT_CRASH_AT", None)
        base["AGENT_ARTIFACTS"] = self.artifacts
        # Torture kills the same step again and again on purpose: the recovery
        # limit, which fails such a task, would end the experiment early.
        base.setdefault("NINELIVES_MAX_RECOVERIES", "1000000")
        base.pop("NINELIVES_CRASH_PAUSE", None)
        if pause > 0:
            base["NINELIVES_CRASH_PAUSE"] = repr(pause)
        self.env = base
        self.command = [sys.executable, "-m", "ninelives", "--db", self.db]
        self._log = log

    def say(self, line: str) -> None:
        """Log one line of progress (nothing without a ``log``)."""
        if self._log is not None:
            self._log(f"torture: {line}")

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run one ``ninelives`` command on the session's database, to its end."""
        with self._starting():
            return subprocess.run(
                [*self.command, *args],
                env=self.env,
                capture_output=True,
                text=True,
                # Stray bytes of a tool module's output are no ValueError of the start.
                errors="replace",
                timeout=600,
                check=False,
            )

    def spawn_run(self, task_id: str) -> subprocess.Popen[str]:
        """Start ``ninelives run`` of ``task_id``, to be killed or waited for."""
        with self._starting():
            return subprocess.Popen(
                [*self.command, "run", "-q", task_id],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
            )

    @contextmanager
    def _starting(self) -> Iterator[None]:
        """Starts of the runs' command inside: one that the system refuses is a
        :class:`StoreError` (exit 5), nothing of the session having run.

        ``sys.executable`` is empty in an interpreter that cannot tell where it
        is (started under a name not on ``PATH``, embedded), and exec can fail
        for a missing or unexecutable file or an oversized environment;
        ``ValueError`` is a variable of ``env`` that no process can be given (a
        NUL, an ``=`` in its name)."""
        try:
            yield
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            what = f"{self.command[0]} -m ninelives: {reason}"
            if not self.command[0]:
                what = "this interpreter does not know its own path (sys.executable is empty)"
            raise StoreError(f"torture cannot start its runs: {what}") from exc

    def create(self, task_id: str) -> None:
        """Create ``task_id`` of the session's plan or workflow (StoreError if refused)."""
        done = self.cli("create", task_id, *self.subject)
        if done.returncode != 0:
            raise StoreError(f"create {task_id} exited {done.returncode}: {_last(done.stderr)}")

    def calibrate(self) -> tuple[tuple[float, float], int]:
        """Kill delays span the part of an uninterrupted run that does the work.

        Measured on one run of a ``calibration`` task: from its start to the
        journal's first event of that run (interpreter start-up and opening
        the database), then to its last event. Kills spent on start-up would
        prove little, so the window begins just before the recovery commit.
        Also returns how many journal events that run committed.
        """
        from ..store import open_store

        self.create("calibration")
        spawned = time.time()
        ran = self.cli("run", "-q", "calibration")
        if ran.returncode != 0:
            raise TaskFailed(
                f"the task does not run cleanly even without kills (exit {ran.returncode}): "
                f"{_last(ran.stderr)}"
            )
        store = open_store(self.db, create=False)
        try:
            events = store.events("calibration")
        finally:
            store.close()
        stamps = [e.ts for e in events if e.kind != EventKind.TASK_CREATED.value]
        first, last = min(stamps) - spawned, max(stamps) - spawned
        return (max(first * 0.9, 0.0), max(last * 1.1, first + 0.005)), len(stamps)


#: What begins each error line of a command: a child's line quoted inside
#: torture's own would otherwise repeat it ("ninelives: error: ... ninelives: error:").
ERROR_PREFIX = "ninelives: error: "


def _last(text: str) -> str:
    """The last line a child run wrote on stderr, without its error prefix."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].removeprefix(ERROR_PREFIX) if lines else "(no output)"


def _kill(
    proc: subprocess.Popen[str],
    rng: random.Random,
    window: tuple[float, float],
    commits: int,
    _journal_length: Callable[[], int],
) -> tuple[int, str]:
    """SIGKILL ``proc`` at a random moment, unless it exits first.

    Half the kills come after a delay drawn from ``window``; the other half
    after a random number (1..``commits``) of new journal events, plus up to
    4 ms: commits are the boundaries that matter, and at machine speed a
    timed kill rarely lands between a tool's effect and its commit.
    """
    if rng.random() < 0.5:
        wanted, delay = None, rng.uniform(*window)
        deadline: float | None = time.monotonic() + delay
    else:
        wanted, delay = rng.randint(1, max(commits, 1)), rng.uniform(0.0, 0.004)
        deadline, start = None, _journal_length()
    while proc.poll() is None:
        now = time.monotonic()
        if deadline is None:
            if _journal_length() - start >= wanted:  # type: ignore[operator]
                deadline = now + delay
            else:
                time.sleep(0.0005)
                continue
        if now >= deadline:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(min(deadline - now, 0.002))
    _, err = proc.communicate(timeout=600)
    return proc.returncode, err


def _journal_length(store: Any, task_id: str) -> int:
    return len(store.events(task_id))


def _observe(lane: Lane, task: Task) -> None:
    seen = lane.observed.setdefault(task.id, {})
    for step in task.steps:
        if step.status is StepStatus.DONE and step.idx not in seen:
            seen[step.idx] = step.output


def run_lane(session: Session, lane: Lane, window: tuple[float, float], commits: int) -> None:
    """Create, kill and rerun tasks until ``lane`` has spent its kills, each task
    resumed to the end; a run that fails otherwise ends the lane with a problem."""
    from ..store import open_store

    store = open_store(session.db, create=False)
    try:
        number = 0
        while lane.kills < lane.quota:
            task_id = f"torture-{lane.number}-{number}"
            number += 1
            session.create(task_id)
            lane.tasks.append(task_id)
            finished = False
            while lane.kills < lane.quota and not finished:
                proc = session.spawn_run(task_id)
                lane.runs += 1
                length = functools.partial(_journal_length, store, task_id)
                code, err = _kill(proc, lane.rng, window, commits, length)
                if code == -signal.SIGKILL:
                    lane.kills += 1
                elif code == 0:
                    finished = True
                else:
                    lane.problems.append(f"{task_id}: run exited {code}: {_last(err)}")
                    return
                _observe(lane, read_consistent(store, task_id)[0])
            if not finished:
                ran = session.cli("run", "-q", task_id)
                lane.runs += 1
                if ran.returncode != 0:
                    lane.problems.append(
                        f"{task_id}: final run exited {ran.returncode}: {_last(ran.stderr)}"
                    )
                    return
            session.say(f"lane {lane.number}: {task_id} done, {lane.kills}/{lane.quota} kills")
    finally:
        store.close()
