"""The :class:`Lab`: a scratch folder, a scrubbed environment and the CLI as a subprocess."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..journal import invariant_violations
from ..models import Event, EventKind

SUMMARY_NOTES = "Line one\n\n  Line two  \nLine three\nLine four\n"
GUIDE_PLAN: dict[str, Any] = {
    "goal": "Summarize notes into a report",
    "steps": [
        {"tool": "fetch", "input": {"path": "input/notes.txt"}},
        {"tool": "summarize", "input": {"from": 0}},
        {"tool": "write_artifact", "input": {"from": 1}},
    ],
}

#: The tables the guide's own restart-lab code creates (schema version 0).
GUIDE_SCHEMA = """
CREATE TABLE tasks (id TEXT PRIMARY KEY, goal TEXT, status TEXT, created_at REAL, updated_at REAL);
CREATE TABLE steps (task_id TEXT, idx INTEGER, tool TEXT, input TEXT,
                    status TEXT DEFAULT 'pending', output TEXT, attempts INTEGER DEFAULT 0,
                    PRIMARY KEY (task_id, idx));
CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL, task_id TEXT,
                     run_id TEXT, kind TEXT, step_idx INTEGER, data TEXT);
"""

#: The keys every ``export`` line starts with, in this order.
EXPORT_KEYS = ("seq", "ts", "run", "kind", "step")

#: Environment variables of the parent that never reach a lab's children: they
#: would steer the runs under test (crash points, delays, effects, database).
SCRUBBED_PREFIXES = ("AGENT_", "NINELIVES_LLM")
SCRUBBED_NAMES = ("NINELIVES_DB", "NINELIVES_WORKSPACE")


def cli_command() -> list[str]:
    """The installed ``ninelives`` script beside this interpreter, else ``python -m ninelives``."""
    script = Path(sys.executable).with_name("ninelives")
    return [str(script)] if script.exists() else [sys.executable, "-m", "ninelives"]


@dataclass(frozen=True, kw_only=True)
class Result:
    """A finished CLI process."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        """stdout decoded as one JSON document."""
        return json.loads(self.stdout)

    def jsonl(self) -> list[dict[str, Any]]:
        """stdout decoded as JSON Lines."""
        return [json.loads(line) for line in self.stdout.splitlines() if line.strip()]


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """A task as ``status --outputs`` and ``export`` show it at one moment."""

    status: dict[str, Any]
    events: list[dict[str, Any]]

    @property
    def outputs(self) -> dict[int, Any]:
        """Committed outputs of the done steps, by index."""
        return {s["idx"]: s["output"] for s in self.status["steps"] if s["status"] == "done"}

    def steps_with(self, status: str) -> set[int]:
        """Indexes of the steps in ``status``."""
        return {s["idx"] for s in self.status["steps"] if s["status"] == status}

    def journal(self) -> list[Event]:
        """The exported journal as :class:`~ninelives.models.Event` records."""
        return events_from_export(self.status.get("task", ""), self.events)


def events_from_export(task_id: str, rows: Iterable[Mapping[str, Any]]) -> list[Event]:
    """Turn ``export`` lines back into events (the data keys are those after the fixed five)."""
    return [
        Event(
            seq=row["seq"],
            ts=row["ts"],
            task_id=task_id,
            run_id=row["run"],
            kind=row["kind"],
            step_idx=row["step"],
            data={k: v for k, v in row.items() if k not in EXPORT_KEYS},
        )
        for row in rows
    ]


def _describe_file(path: Path) -> str:
    mode = path.lstat().st_mode
    if stat.S_ISLNK(mode):
        return f"symlink -> {os.readlink(path)}"
    if stat.S_ISDIR(mode):
        return "folder"
    if not stat.S_ISREG(mode):
        return f"special file {stat.filemode(mode)}"
    import hashlib

    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class Lab:
    """One scratch folder with a database, an artifacts folder and the CLI.

    Every ``AGENT_*`` variable of the parent (and ``NINELIVES_DB``,
    ``NINELIVES_WORKSPACE``) is removed from the children's environment; pass
    per-call variables as keyword arguments of :meth:`cli` and :meth:`spawn`.
    """

    root: Path
    db: str = "state.db"
    command: list[str] = field(default_factory=cli_command)
    base_env: dict[str, str] = field(default_factory=dict)
    _spawned: list[subprocess.Popen[str]] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.root.mkdir(parents=True, exist_ok=True)

    # -- files ---------------------------------------------------------------

    def write(self, relpath: str, text: str) -> Path:
        """Write a file under the lab folder (parents created)."""
        path = self.root / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path

    def write_plan(self, plan: Mapping[str, Any], name: str = "plan.json") -> Path:
        """Write a plan file and return its path."""
        return self.write(name, json.dumps(plan))

    def guide_setup(self, notes: str = SUMMARY_NOTES) -> Path:
        """The guide's input file and 3-step plan; returns the plan path."""
        self.write("input/notes.txt", notes)
        return self.write_plan(GUIDE_PLAN)

    @property
    def artifacts_dir(self) -> Path:
        """Where ``write_artifact`` publishes (``AGENT_ARTIFACTS`` default)."""
        return self.root / self.base_env.get("AGENT_ARTIFACTS", "artifacts")

    def artifacts(self) -> dict[str, str]:
        """Every entry of the artifacts folder (temp files included), by name.

        Regular files map to their text; anything else (a planted symlink, a
        folder) to a description, so nothing is ever followed.
        """
        folder = self.artifacts_dir
        if not folder.is_dir():
            return {}
        found = {}
        for path in sorted(folder.iterdir()):
            if stat.S_ISREG(path.lstat().st_mode):
                # Bytes decoded as they are: no newline translation hides a "\r\n".
                found[path.name] = path.read_bytes().decode("utf-8", "backslashreplace")
            else:
                found[path.name] = _describe_file(path)
        return found

    @property
    def sqlite_path(self) -> Path | None:
        """The database file when the lab runs on SQLite, else None."""
        if self.db.startswith(("postgresql://", "postgres://")):
            return None
        path = Path(
            self.db.removeprefix("sqlite://") if self.db.startswith("sqlite:///") else self.db
        )
        return path if path.is_absolute() else self.root / path

    def files(self, under: Path | None = None) -> dict[str, str]:
        """Every file, folder and link under ``under`` (default: the lab folder),
        by relative path: a content hash, ``folder`` or the link's target."""
        base = Path(under) if under is not None else self.root
        found = {}
        for folder, dirs, names in os.walk(base):
            for name in [*dirs, *names]:
                path = Path(folder) / name
                found[str(path.relative_to(base))] = _describe_file(path)
        return found

    def fingerprint(self, *task_ids: str) -> dict[str, Any]:
        """Everything a command could have changed; two equal fingerprints mean
        nothing changed.

        Always the files under the lab folder (content hashes, so a SQLite
        database's bytes are part of it). When the database is not a local file
        (PostgreSQL), also each task's ``status --outputs`` and ``export`` as
        the CLI prints them; on SQLite the database bytes already cover them.
        """
        tasks = {}
        if self.sqlite_path is None:
            for task_id in task_ids:
                status = self.cli("status", task_id, "--outputs")
                export = self.cli("export", task_id)
                tasks[task_id] = {
                    "status": (status.returncode, status.stdout),
                    "export": (export.returncode, export.stdout),
                }
        return {"files": self.files(), "tasks": tasks}

    # -- processes -----------------------------------------------------------

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The children's environment: the parent's without ``AGENT_*``, plus extras."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(SCRUBBED_PREFIXES) and k not in SCRUBBED_NAMES
        }
        env.update(self.base_env)
        env.update(extra or {})
        return env

    def argv(self, args: Sequence[str]) -> list[str]:
        """The full command line for ``ninelives --db DB ARGS``."""
        return [*self.command, "--db", self.db, *args]

    def cli(self, *args: str, timeout: float = 120, **env: str) -> Result:
        """Run one command to completion."""
        proc = subprocess.run(
            self.argv(args),
            cwd=self.root,
            env=self.env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return Result(
            args=tuple(args), returncode=proc.returncode, stdout=proc.stdout, stderr=proc.stderr
        )

    def spawn(self, *args: str, **env: str) -> subprocess.Popen[str]:
        """Start a command and return at once (:meth:`reap` kills it if still running)."""
        proc = subprocess.Popen(
            self.argv(args),
            cwd=self.root,
            env=self.env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._spawned.append(proc)
        return proc

    def reap(self) -> None:
        """SIGKILL and collect every spawned process still running (test teardown)."""
        while self._spawned:
            proc = self._spawned.pop()
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=60)

    def snapshot(self, task_id: str) -> Snapshot:
        """The task's status with outputs and its journal, read through the CLI."""
        status = self.cli("status", task_id, "--outputs")
        if status.returncode != 0:
            raise AssertionError(f"status {task_id} exited {status.returncode}: {status.stderr}")
        events = self.cli("export", task_id)
        if events.returncode != 0:
            raise AssertionError(f"export {task_id} exited {events.returncode}: {events.stderr}")
        return Snapshot(status=status.json(), events=events.jsonl())

    def wait_for(
        self, task_id: str, kind: str, step: int | None = None, *, count: int = 1,
        timeout: float = 30,
    ) -> None:  # fmt: skip
        """Poll the journal until ``count`` events of ``kind`` (for ``step``) exist."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            events = self.cli("export", task_id).jsonl()
            seen = [e for e in events if e["kind"] == kind and (step is None or e["step"] == step)]
            if len(seen) >= count:
                return
            time.sleep(0.05)
        raise TimeoutError(f"no {kind} event for step {step} of {task_id} within {timeout}s")

    @staticmethod
    def kill(proc: subprocess.Popen[str], sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` and return the exit status (``-9`` after SIGKILL)."""
        if proc.poll() is None:
            proc.send_signal(sig)
        proc.communicate(timeout=60)
        return proc.returncode


def five_property_violations(
    *,
    plan: Mapping[str, Any],
    after: Snapshot,
    before: Snapshot | None = None,
    runs: int | None,
    artifacts: Mapping[str, str],
    expected_artifacts: Mapping[str, str],
) -> list[str]:
    """The ways a resumed task breaks the five properties (empty when it keeps them).

    ``before`` is the task as the kill left it (None for an uninterrupted run),
    ``after`` the task once resumed to the end, ``runs`` the number of ``run``
    processes that held the task (None when unknown, as after random kills:
    then each run is still checked to have exactly one ``run_started``), and
    ``artifacts`` what the artifacts folder holds.
    """
    problems: list[str] = []
    problems += _state_preserved(plan, before, after)
    problems += _resumed(before, after)
    problems += _recovered(before, after)
    # 4. Effects happen once in outcome: exactly the expected files, nothing
    # duplicated, no temporary file left behind.
    if dict(artifacts) != dict(expected_artifacts):
        problems.append(f"artifacts {dict(artifacts)!r} != expected {dict(expected_artifacts)!r}")
    problems += _journal_complete(after, runs)
    return problems


def _state_preserved(
    plan: Mapping[str, Any], before: Snapshot | None, after: Snapshot
) -> list[str]:
    """1. The task, its plan and every output committed before the kill are still there."""
    problems = []
    steps = after.status["steps"]
    planned = [s["tool"] for s in plan["steps"]]
    if [s["tool"] for s in steps] != planned:
        problems.append(f"plan changed: {[s['tool'] for s in steps]} != {planned}")
    if after.status["status"] != "done":
        problems.append(f"task is {after.status['status']}, not done")
    not_done = sorted(s["idx"] for s in steps if s["status"] != "done" or s.get("output") is None)
    if not_done:
        problems.append(f"steps {not_done} are not done with an output")
    if before is not None:
        if before.status["task"] != after.status["task"]:
            problems.append("snapshots of different tasks")
        for idx, output in before.outputs.items():
            if after.outputs.get(idx) != output:
                problems.append(f"step {idx}: committed output changed after the kill")
        if after.events[: len(before.events)] != before.events:
            problems.append("journal rows written before the kill were changed or removed")
    return problems


def _resumed(before: Snapshot | None, after: Snapshot) -> list[str]:
    """2. Steps committed ``done`` never start again: neither those done in
    ``before``, nor, across every earlier kill, any step the journal shows finished."""
    problems = []
    if before is not None:
        done = before.steps_with("done")
        restarted = {
            e["step"]
            for e in after.events[len(before.events) :]
            if e["kind"] == EventKind.STEP_STARTED.value and e["step"] in done
        }
        if restarted:
            problems.append(
                f"steps {sorted(restarted)} were done before the kill but started again"
            )
    finished: dict[int, int] = {}
    for e in after.events:
        if e["kind"] == EventKind.STEP_FINISHED.value:
            finished.setdefault(e["step"], e["seq"])
        elif e["kind"] == EventKind.STEP_STARTED.value and e["step"] in finished:
            problems.append(
                f"step {e['step']} started again at seq {e['seq']} after it finished "
                f"at seq {finished[e['step']]}"
            )
    return problems


def _recovered(before: Snapshot | None, after: Snapshot) -> list[str]:
    """3. A step found ``running`` goes back to ``pending`` with a ``step_recovered``,
    and each ``run_started`` lists exactly the steps its run recovered."""
    problems = []
    if before is not None:
        interrupted = before.steps_with("running")
        recovered = {
            e["step"]
            for e in after.events[len(before.events) :]
            if e["kind"] == EventKind.STEP_RECOVERED.value
        }
        if interrupted - recovered:
            problems.append(
                f"steps left running {sorted(interrupted)} but recovered {sorted(recovered)}"
            )
    # Replay the journal: the steps still open when a run begins are exactly
    # the ones that run must recover and list in its run_started.
    open_steps: set[int] = set()
    open_at_start: dict[str, set[int]] = {}
    recovered_by: dict[str, set[int]] = {}
    for e in after.events:
        kind, step, run = e["kind"], e["step"], e["run"]
        if kind in (EventKind.STEP_RECOVERED.value, EventKind.RUN_STARTED.value):
            open_at_start.setdefault(run, set(open_steps))
        if kind == EventKind.STEP_STARTED.value:
            open_steps.add(step)
        elif kind in (EventKind.STEP_FINISHED.value, EventKind.STEP_ERROR.value):
            open_steps.discard(step)
        elif kind == EventKind.STEP_RECOVERED.value:
            open_steps.discard(step)
            recovered_by.setdefault(run, set()).add(step)
        elif kind == EventKind.RUN_STARTED.value:
            listed = set(e.get("recovered") or [])
            did = recovered_by.get(run, set())
            if listed != did:
                problems.append(
                    f"run {run}: run_started lists {sorted(listed)} but step_recovered "
                    f"events name {sorted(did)}"
                )
            if open_at_start[run] != did:
                problems.append(
                    f"run {run}: steps {sorted(open_at_start[run])} were left running "
                    f"but it recovered {sorted(did)}"
                )
    return problems


def _journal_complete(after: Snapshot, runs: int | None) -> list[str]:
    """5. The invariant holds and every process shows as its own ``run_started``."""
    events = after.journal()
    problems = list(invariant_violations(events))
    seqs = [e.seq for e in events]
    if seqs != sorted(set(seqs)):
        problems.append("journal is not in strictly increasing seq order")
    started = {e.run_id for e in events if e.kind == EventKind.RUN_STARTED.value}
    if runs is not None and len(started) != runs:
        problems.append(f"{len(started)} runs have a run_started, expected {runs}")
    acting = {e.run_id for e in events if e.kind != EventKind.TASK_CREATED.value}
    if acting - started:
        problems.append(f"runs {sorted(acting - started)} wrote events without a run_started")
    return problems
