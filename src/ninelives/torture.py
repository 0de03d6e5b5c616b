"""``ninelives torture``: run fresh tasks of a plan under random SIGKILLs, then prove it.

The tasks are of a plan file, or of a workflow (``--workflow NAME --args JSON``,
from a module named with ``--tools``): each is created as ``create`` would.
Each worker lane creates a task of the plan and runs it with the ``ninelives``
command (this interpreter's ``-m ninelives``, so tools from entry points load
as they would in production), SIGKILLs the run at a random, seeded moment
(see :func:`_kill`; the runs pause briefly at every crash point so those
moments fall between commits), reads what the database acknowledges as
done, and runs it again, until its
share of the kills is spent; each task is then resumed to the end, and a task
that finishes before the next kill is followed by a fresh one. At the end
every task is checked with :func:`ninelives.verify.verify_store` and the
counts below are taken:

- kills: run processes that died by our SIGKILL (each survived if the task
  still completed cleanly);
- recoveries: ``step_recovered`` events;
- re-executed effects: step attempts beyond the first of each step;
- duplicates: extra publications, each counted once: a published file that
  holds its recorded content k times counts k - 1 (one whose content differs
  otherwise counts 1), and an append log (``AGENT_UNSAFE_EFFECTS=1``) counts
  each entry beyond the done steps that wrote to it;
- lost commits: a step seen ``done`` in a snapshot between kills that is
  later not done, or whose output changed.

The kill moments come from ``random.Random(seed)``: the same seed replays the
same schedule (where a moment lands in the run still depends on the machine).
Violations (``verify`` findings, runs that failed) are listed with the counts.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import InputError, NineLivesError, StoreError, TaskFailed
from .models import EventKind, StepStatus, Task
from .verify import artifact_outputs, read_consistent, verify_store

DB_NAME = "state.db"
ARTIFACTS_NAME = "artifacts"
#: Entry separator of the built-in unsafe append log (``AGENT_UNSAFE_EFFECTS=1``).
UNSAFE_SEPARATOR = "\n---\n"
#: Seconds the runs sleep at every crash point (``NINELIVES_CRASH_PAUSE``).
DEFAULT_PAUSE = 0.01


@dataclass(frozen=True, kw_only=True)
class TortureReport:
    """What one torture session did and found. ``ok`` is the verdict."""

    plan: str
    seed: int
    workers: int
    folder: str
    window: tuple[float, float]
    tasks: int
    runs: int
    kills: int
    recoveries: int
    reexecuted_effects: int
    duplicates: int
    lost_commits: int
    violations: tuple[str, ...]
    elapsed: float
    kills_asked: int = 0
    kept: bool = True
    #: The workflow tortured instead of a plan (``plan`` is then empty), and its arguments.
    workflow: str | None = None
    args: str = "[]"
    #: One line per duplicate and lost commit found (violations are listed apart).
    details: tuple[str, ...] = ()
    pause: float = DEFAULT_PAUSE

    @property
    def ok(self) -> bool:
        """True when no duplicate, lost commit or violation was found."""
        return not (self.duplicates or self.lost_commits or self.violations)

    def replay_command(self) -> str:
        """The command line that replays this session's kill schedule."""
        import shlex

        extra = f" --workers {self.workers}" if self.workers != 1 else ""
        extra += f" --pause {self.pause:g}" if self.pause != DEFAULT_PAUSE else ""
        subject = self.plan
        if self.workflow is not None:
            subject = f"--workflow {shlex.quote(self.workflow)} --args {shlex.quote(self.args)}"
        return f"ninelives torture {subject} --kills {self.kills_asked} --seed {self.seed}{extra}"

    def summary_lines(self) -> list[str]:
        """The human summary: replay line, counts, then each violation."""
        lo, hi = self.window
        lines = [
            f"seed {self.seed} (replay: {self.replay_command()})",
            f"{self.tasks} task(s), {self.runs} run process(es), kill delay "
            f"{lo:.3f}-{hi:.3f}s, {self.elapsed:.1f}s, folder {self.folder}"
            + ("" if self.kept else " (removed: all clean)"),
            f"kills {self.kills}  recoveries {self.recoveries}  re-executed effects "
            f"{self.reexecuted_effects}  duplicates {self.duplicates}  lost commits "
            f"{self.lost_commits}  violations {len(self.violations)}",
        ]
        lines.extend(f"  {line}" for line in (*self.details, *self.violations))
        return lines


@dataclass
class _Lane:
    """One worker's tasks and tallies (touched by its own thread only)."""

    number: int
    quota: int
    rng: random.Random
    kills: int = 0
    runs: int = 0
    tasks: list[str] = field(default_factory=list)
    observed: dict[str, dict[int, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


class _Session:
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
        if self._log is not None:
            self._log(f"torture: {line}")

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.command, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    def spawn_run(self, task_id: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*self.command, "run", "-q", task_id],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def create(self, task_id: str) -> None:
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
        from .store import open_store

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


def _last(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def _kill(
    proc: subprocess.Popen[str],
    rng: random.Random,
    window: tuple[float, float],
    commits: int,
    journal_length: Callable[[], int],
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
        deadline, start = None, journal_length()
    while proc.poll() is None:
        now = time.monotonic()
        if deadline is None:
            if journal_length() - start >= wanted:  # type: ignore[operator]
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


def _observe(lane: _Lane, task: Task) -> None:
    seen = lane.observed.setdefault(task.id, {})
    for step in task.steps:
        if step.status is StepStatus.DONE and step.idx not in seen:
            seen[step.idx] = step.output


def _run_lane(session: _Session, lane: _Lane, window: tuple[float, float], commits: int) -> None:
    from .store import open_store

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


def lost_commits(observed: Mapping[int, Any], final: Task) -> list[str]:
    """Steps seen done (with these outputs) that ``final`` no longer holds done, unchanged."""
    by_idx = {s.idx: s for s in final.steps}
    lost = []
    for idx, output in sorted(observed.items()):
        step = by_idx.get(idx)
        if step is None or step.status is not StepStatus.DONE:
            lost.append(f"{final.id}: step {idx} was acknowledged done, now it is not")
        elif step.output != output:
            lost.append(f"{final.id}: step {idx} output changed after it was acknowledged")
    return lost


def reexecuted_effects(events: Sequence[Any]) -> int:
    """Step attempts beyond the first, summed over steps (``step_started`` - 1 each)."""
    starts: dict[int, int] = {}
    for event in events:
        if event.kind == EventKind.STEP_STARTED.value and event.step_idx is not None:
            starts[event.step_idx] = starts.get(event.step_idx, 0) + 1
    return sum(n - 1 for n in starts.values() if n > 1)


def _read_published(path: str) -> bytes | None:
    """The bytes of a regular file at ``path``, or None (missing, a FIFO, unreadable)."""
    from . import files

    try:
        fd = files.open_regular(path)
    except (OSError, NineLivesError):
        return None  # a missing or odd file is a verify finding, not a duplicate
    try:
        return files.read_limited(fd, 1 << 30, path)
    except (OSError, NineLivesError):
        return None
    finally:
        os.close(fd)


def published_duplicates(tasks: Sequence[Task], folder: str) -> list[tuple[str, int]]:
    """Files whose content is not the one publication their output records, with
    the number of extra publications each holds: ``k - 1`` for the recorded
    content k times over, 1 for any other difference."""
    from .diskio import sha256_hex

    found = []
    for task in tasks:
        for output in artifact_outputs(task).values():
            name = os.path.basename(output["path"])
            data = _read_published(os.path.join(folder, name))
            if data is None or sha256_hex(data) == output["sha256"]:
                continue
            size = output.get("bytes")
            extra = 1
            if isinstance(size, int) and 0 < size < len(data) and len(data) % size == 0:
                copies = len(data) // size
                if data == data[:size] * copies and sha256_hex(data[:size]) == output["sha256"]:
                    extra = copies - 1
            found.append((f"{name}: {extra} extra publication(s)", extra))
    return found


def append_log_duplicates(tasks: Sequence[Task], folder: str) -> list[tuple[str, int]]:
    """Extra entries in append logs: done outputs that name a ``path`` without a
    ``sha256`` (the built-in unsafe effect) against the entries each file holds;
    each finding comes with its number of extra entries."""
    cited: dict[str, int] = {}
    for task in tasks:
        recorded = artifact_outputs(task)
        for step in task.steps:
            out = step.output
            if (
                step.status is StepStatus.DONE
                and step.idx not in recorded
                and isinstance(out, dict)
                and isinstance(out.get("path"), str)
                and step.tool == "write_artifact"
            ):
                name = os.path.basename(out["path"])
                cited[name] = cited.get(name, 0) + 1
    found = []
    for name, count in sorted(cited.items()):
        data = _read_published(os.path.join(folder, name))
        if data is None:
            continue
        entries = data.decode("utf-8", "replace").count(UNSAFE_SEPARATOR)
        if entries > count:
            found.append((f"{name}: {entries} entries for {count} done step(s)", entries - count))
    return found


def count_duplicates(tasks: Sequence[Task], folder: str) -> tuple[int, list[str]]:
    """Extra publications in ``folder`` (each one counted once), and one line per file."""
    found = [*published_duplicates(tasks, folder), *append_log_duplicates(tasks, folder)]
    return sum(count for _, count in found), [line for line, _ in found]


def torture(
    plan: str | os.PathLike[str] | None = None,
    *,
    workflow: str | None = None,
    args: str = "[]",
    kills: int = 10,
    seed: int | None = None,
    workers: int = 1,
    folder: str | None = None,
    window: tuple[float, float] | None = None,
    pause: float = DEFAULT_PAUSE,
    env: Mapping[str, str] | None = None,
    log: Callable[[str], None] | None = None,
) -> TortureReport:
    """Torture fresh tasks of ``plan`` with ``kills`` SIGKILLs over ``workers`` lanes.

    Instead of a plan, ``workflow`` names a workflow loaded in this process
    (``--tools`` / ``NINELIVES_TOOLS``, which the runs load too) and ``args``
    its arguments as ``create --args`` takes them (JSON text: an array of
    positional arguments or an object of keyword arguments).
    ``folder`` (default: a new temporary folder) receives the database and the
    artifacts; it must not hold a database yet. A temporary folder is removed
    again when everything is clean, kept otherwise. ``window`` fixes the range of
    kill delays in seconds (default: calibrated by one uninterrupted run).
    ``pause`` seconds are slept at every crash point of the runs
    (``NINELIVES_CRASH_PAUSE``), so random kills land between every pair of
    commits even when the tools take microseconds; 0 runs at full speed.
    ``env`` adds variables for the runs. Raises :class:`InputError` for bad
    arguments; the findings are in the returned report, never raised.
    """
    import shutil
    import tempfile
    import threading

    if kills < 0:
        raise InputError(f"--kills must be at least 0, got {kills}")
    if workers < 1:
        raise InputError(f"--workers must be at least 1, got {workers}")
    if not 0 <= pause <= 60:
        raise InputError(f"--pause must be 0-60 seconds, got {pause}")
    if (plan is None) == (workflow is None):
        raise InputError("torture takes a plan file or --workflow NAME, not both or neither")
    if workflow is not None:
        _check_workflow(workflow, args)
        subject: tuple[str, ...] = ("--workflow", workflow, "--args", args)
        plan_path = ""
    else:
        plan_path = os.path.abspath(os.fspath(plan))  # type: ignore[arg-type]
        _check_plan(plan_path)
        subject = (plan_path,)
    seed = int.from_bytes(os.urandom(4), "big") if seed is None else seed
    scratch = folder is None
    if folder is None:
        folder = tempfile.mkdtemp(prefix="ninelives-torture-")
    folder = os.path.abspath(folder)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise InputError(f"--dir {folder} is not a folder: give a new or empty folder")
    if os.path.exists(os.path.join(folder, DB_NAME)):
        raise InputError(f"{folder} already holds a database: give a new or empty folder")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create --dir {folder}: {exc.strerror or exc}") from None
    session = _Session(subject, folder, env, log, pause)
    session.say(f"seed {seed}, {kills} kill(s), {workers} worker(s), folder {folder}")
    started = time.monotonic()
    try:
        if window is None or workflow is not None:
            # A workflow's steps are known only by running it: its commits are counted too.
            span, commits = session.calibrate()
            span = span if window is None else window
            session.say(f"kill delays {span[0]:.3f}-{span[1]:.3f}s or after 1-{commits} commits")
        else:
            span, commits = window, 2 * _plan_steps(plan_path) + 3
    except BaseException:
        # Nothing was tortured yet: a scratch folder of ours holds nothing to look at.
        if scratch:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    lanes = [
        _Lane(
            number=i,
            quota=kills // workers + (1 if i < kills % workers else 0),
            rng=random.Random(f"{seed}:{i}"),
        )
        for i in range(workers)
    ]
    errors: list[str] = []

    def guarded(lane: _Lane) -> None:
        try:
            _run_lane(session, lane, span, commits)
        except NineLivesError as exc:
            errors.append(f"lane {lane.number}: {exc}")

    threads = [threading.Thread(target=guarded, args=(lane,)) for lane in lanes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    report = _report(
        session,
        lanes,
        errors,
        seed=seed,
        workers=workers,
        kills=kills,
        window=span,
        elapsed=time.monotonic() - started,
    )
    report = dataclasses.replace(report, pause=pause, workflow=workflow, args=args)
    if scratch and report.ok:
        shutil.rmtree(folder, ignore_errors=True)
        report = dataclasses.replace(report, kept=False)
    return report


def _check_plan(path: str) -> None:
    from .plan import load_plan, validate
    from .settings import Settings
    from .tools.builtin import default_registry

    validate(load_plan(path), default_registry(Settings.from_env()).lookup)


def _check_workflow(name: str, args: str) -> None:
    """Refuse a workflow not loaded here or arguments ``create`` would refuse (InputError)."""
    from .durable import lookup, parse_arguments, prepare
    from .settings import Settings
    from .tools.builtin import default_registry

    default_registry(Settings.from_env())  # imports the NINELIVES_TOOLS modules
    positional, keywords = parse_arguments(args)
    prepare("torture-0-0", lookup(name), positional, keywords)


def _plan_steps(path: str) -> int:
    from .plan import load_plan

    return len(load_plan(path).steps)


def _report(
    session: _Session,
    lanes: Sequence[_Lane],
    errors: Sequence[str],
    *,
    seed: int,
    workers: int,
    kills: int,
    window: tuple[float, float],
    elapsed: float,
) -> TortureReport:
    from .store import open_store

    problems = list(errors)
    for lane in lanes:
        problems.extend(lane.problems)
    details: list[str] = []
    recoveries = reexecuted = lost = duplicates = 0
    store = open_store(session.db, create=False)
    try:
        verdict = verify_store(store, artifacts=session.artifacts)
        tasks: list[Task] = []
        for task_id in store.task_ids():
            task, events = read_consistent(store, task_id)
            tasks.append(task)
            recoveries += sum(1 for e in events if e.kind == EventKind.STEP_RECOVERED.value)
            reexecuted += reexecuted_effects(events)
    finally:
        store.close()
    by_id = {t.id: t for t in tasks}
    for lane in lanes:
        for task_id, seen in lane.observed.items():
            if task_id in by_id:
                found = lost_commits(seen, by_id[task_id])
                lost += len(found)
                details.extend(f"lost commit: {line}" for line in found)
    problems.extend(str(violation) for violation in verdict.violations)
    duplicates, found = count_duplicates(tasks, session.artifacts)
    details.extend(f"duplicate: {line}" for line in found)
    return TortureReport(
        plan=os.path.relpath(session.subject[0]) if len(session.subject) == 1 else "",
        seed=seed,
        workers=workers,
        folder=session.folder,
        window=window,
        tasks=sum(len(lane.tasks) for lane in lanes),
        runs=sum(lane.runs for lane in lanes),
        kills=sum(lane.kills for lane in lanes),
        recoveries=recoveries,
        reexecuted_effects=reexecuted,
        duplicates=duplicates,
        lost_commits=lost,
        violations=tuple(problems),
        elapsed=elapsed,
        kills_asked=kills,
        details=tuple(details),
    )
