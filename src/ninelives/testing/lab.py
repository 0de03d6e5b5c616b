"""The :class:`Lab`: a scratch folder, a scrubbed environment and the CLI as a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..journal import CLOSING_KINDS

SUMMARY_NOTES = "Line one\n\n  Line two  \nLine three\nLine four\n"
GUIDE_PLAN: dict[str, Any] = {
    "goal": "Summarize notes into a report",
    "steps": [
        {"tool": "fetch", "input": {"path": "input/notes.txt"}},
        {"tool": "summarize", "input": {"from": 0}},
        {"tool": "write_artifact", "input": {"from": 1}},
    ],
}


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


@dataclass
class Lab:
    """One scratch folder with a database, an artifacts folder and the CLI.

    Every ``AGENT_*`` variable of the parent is removed from the children's
    environment; pass per-call variables as keyword arguments of :meth:`cli`.
    """

    root: Path
    db: str = "state.db"
    command: list[str] = field(default_factory=cli_command)
    base_env: dict[str, str] = field(default_factory=dict)

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
        """Every file in the artifacts folder (temp files included), by name."""
        folder = self.artifacts_dir
        if not folder.is_dir():
            return {}
        return {p.name: p.read_text(encoding="utf-8") for p in sorted(folder.iterdir())}

    # -- processes -----------------------------------------------------------

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The children's environment: the parent's without ``AGENT_*``, plus extras."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
        env.pop("NINELIVES_DB", None)
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
        """Start a command and return at once."""
        return subprocess.Popen(
            self.argv(args),
            cwd=self.root,
            env=self.env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def snapshot(self, task_id: str) -> Snapshot:
        """The task's status with outputs and its journal, read through the CLI."""
        status = self.cli("status", task_id, "--outputs")
        if status.returncode != 0:
            raise AssertionError(f"status {task_id} exited {status.returncode}: {status.stderr}")
        events = self.cli("export", task_id)
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
        proc.send_signal(sig)
        proc.communicate(timeout=60)
        return proc.returncode


def five_property_violations(
    *,
    plan: Mapping[str, Any],
    after: Snapshot,
    before: Snapshot | None = None,
    runs: int,
    artifacts: Mapping[str, str],
    expected_artifacts: Mapping[str, str],
) -> list[str]:
    """The ways a resumed task breaks the five properties (empty when it keeps them).

    ``before`` is the task as the kill left it (None for an uninterrupted run),
    ``after`` the task once resumed to the end, ``runs`` the number of ``run``
    processes that held the task, ``artifacts`` what the artifacts folder holds.
    """
    problems: list[str] = []
    steps = after.status["steps"]
    # 1. State is preserved: plan intact, outputs committed before the kill unchanged.
    planned = [s["tool"] for s in plan["steps"]]
    if [s["tool"] for s in steps] != planned:
        problems.append(f"plan changed: {[s['tool'] for s in steps]} != {planned}")
    if after.status["status"] != "done":
        problems.append(f"task is {after.status['status']}, not done")
    if before is not None:
        for idx, output in before.outputs.items():
            if after.outputs.get(idx) != output:
                problems.append(f"step {idx}: committed output changed after the kill")
    # 2. The task resumes: steps done before the kill never start again.
    resume_runs = _runs_after(before, after)
    if before is not None:
        restarted = {
            e["step"]
            for e in after.events[len(before.events) :]
            if e["kind"] == "step_started" and e["step"] in before.steps_with("done")
        }
        if restarted:
            problems.append(
                f"steps {sorted(restarted)} were done before the kill but started again"
            )
    # 3. Interrupted steps are recovered explicitly.
    if before is not None:
        interrupted = before.steps_with("running")
        recovered = {
            e["step"] for e in after.events[len(before.events) :] if e["kind"] == "step_recovered"
        }
        if interrupted != recovered:
            problems.append(
                f"steps left running {sorted(interrupted)} != recovered {sorted(recovered)}"
            )
        first = next((e for e in after.events if e["run"] in resume_runs), None)
        if interrupted and (
            first is None or sorted(first.get("recovered", [])) != sorted(interrupted)
        ):
            problems.append("the resuming run_started does not list the recovered steps")
    # 4. Effects happen once in outcome.
    if dict(artifacts) != dict(expected_artifacts):
        problems.append(f"artifacts {dict(artifacts)!r} != expected {dict(expected_artifacts)!r}")
    # 5. The journal is complete.
    kinds = [e["kind"] for e in after.events]
    started = kinds.count("step_started")
    closed = sum(kinds.count(k) for k in CLOSING_KINDS)
    if started != closed:
        problems.append(f"journal invariant: {started} step_started != {closed} closing events")
    run_starts = [e["run"] for e in after.events if e["kind"] == "run_started"]
    if len(run_starts) != runs or len(set(run_starts)) != runs:
        problems.append(
            f"{len(run_starts)} run_started ({len(set(run_starts))} run ids) for {runs} runs"
        )
    if [e["seq"] for e in after.events] != sorted(e["seq"] for e in after.events):
        problems.append("journal is not in seq order")
    return problems


def _runs_after(before: Snapshot | None, after: Snapshot) -> set[str]:
    start = len(before.events) if before is not None else 0
    return {e["run"] for e in after.events[start:] if e["kind"] == "run_started"}
