"""The kill-test kit: every step x every crash point of *your* plan, in a few lines.

In a test file::

    from ninelives.testing.kit import kill_matrix

    test_report_plan = kill_matrix(
        "plan.json",                                # relative to this test file
        files={"input/notes.txt": "one\\ntwo\\nthree\\n"},
    )

pytest then collects one test per case (:meth:`KillKit.cases`): an
uninterrupted baseline; ``create`` and the run's recovery killed before they
commit; a run killed right after its recovery commit; each step killed at
``before_effect``, ``after_effect`` and ``after_commit`` (and, for steps that
publish files, at ``artifact_before_link`` and ``artifact_before_dirsync``);
a SIGKILL sent from outside while a step runs; a second runner refused with
exit 3 while the first runs; and a negative control. Every killed process
must die by SIGKILL (-9), which proves the crash point was reached; every
resumed task must keep the five properties
(:func:`~ninelives.testing.lab.five_property_violations`) and pass
``ninelives verify --artifacts``.

Your tools run in real ``ninelives`` processes, so register them through the
``ninelives.tools`` entry point group of your package. The negative control
runs the kill at ``after_effect`` of the last effect step with ``negative_env``
set (default for plans with ``write_artifact``: ``AGENT_UNSAFE_EFFECTS=1``)
and passes only if the checks *fail*; give ``negative_env`` a variable that
makes your own tool skip its idempotency key. Without one, the control plants
a duplicate artifact and requires the checks to notice.

A workflow (``@ninelives.workflow``) is tested the same way: name it, its
arguments and the module that defines it instead of a plan::

    test_triage = kill_matrix(workflow="triage", args=["T-7"], tools="triage_app")

The module is imported by every ``ninelives`` process the kit runs, from the
installed packages or from the test file's folder. A workflow's steps are
known only by running it, so the kit runs it once, uninterrupted, when the
cases are generated: every step it called gets the three crash points (and the
artifact points, for steps named in ``artifact_tools``), and every resumed run
must call the same steps. ``effects`` (a callable given the scratch folder)
reads what the steps did outside the artifacts folder; what it returns after
every resumed run must equal what it returns after the uninterrupted one.

The same cases are available without the helper: mark a test
``@pytest.mark.ninelives("plan.json", files=...)`` (or set the ini option
``ninelives_plan``) and take the ``ninelives_case`` argument; see
:mod:`ninelives.testing.plugin`.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .lab import Lab, Snapshot, five_property_violations

#: Crash points a kill matrix drives per step, in order.
STEP_POINTS = ("before_effect", "after_effect", "after_commit")
#: Crash points of :func:`ninelives.tools.effects.publish_once`, per publishing step.
ARTIFACT_POINTS = ("artifact_before_link", "artifact_before_dirsync")
#: Crash points around the task rather than a step.
TASK_POINTS = ("create_before_commit", "recovery_before_commit", "after_recovery")
#: Seconds each step sleeps in the lock case (the kill ends it early).
HOLD_DELAY = "60"
#: Seconds each step sleeps in the outside-kill case, which kills mid-step 1.
OUTSIDE_DELAY = "1"
KILLED = -signal.SIGKILL
#: What an uninterrupted run leaves: its artifacts, and what ``effects`` read.
Baseline = tuple[dict[str, str], Any]


@dataclass(frozen=True, kw_only=True)
class KillCase:
    """One generated test: ``kind`` is baseline, crash, outside_kill, lock or
    negative_control; crash cases name a ``point`` and, for step points, a ``step``."""

    kind: str
    point: str | None = None
    step: int | None = None

    @property
    def id(self) -> str:
        """The pytest id: ``after_effect-step2``, ``outside_kill``..."""
        if self.kind != "crash":
            return self.kind
        return str(self.point) if self.step is None else f"{self.point}-step{self.step}"

    def __str__(self) -> str:
        return self.id


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """The end of a case: the task as resumed, its artifacts, and what the checks found."""

    after: Snapshot
    artifacts: dict[str, str]
    problems: list[str]


class KillKit:
    """A plan or a workflow under test and the workspace its steps need.

    ``plan`` is a plan file (relative paths resolve against ``base``) or plan
    JSON as a dict; or else ``workflow`` names a workflow, ``args`` are its
    arguments (a list: positional, a dict: keyword; they must be JSON) and
    ``tools`` the module(s) that define it (comma-separated, as ``--tools``).
    ``files`` maps relative paths to text written into every scratch folder
    before the task is created (an absolute path, or one that climbs out with
    ``..``, is a ``ValueError``); ``env`` adds variables for every command;
    ``artifact_tools`` names the tools (or workflow steps) that publish with
    :func:`~ninelives.tools.effects.publish_once` (their steps also get the
    artifact crash points); ``negative_env`` and ``effects`` are described in
    the module docs.
    """

    def __init__(
        self,
        plan: str | os.PathLike[str] | Mapping[str, Any] | None = None,
        *,
        workflow: str | None = None,
        args: Sequence[Any] | Mapping[str, Any] = (),
        tools: str | None = None,
        files: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        base: str | os.PathLike[str] | None = None,
        task_id: str = "kill-test",
        artifact_tools: Sequence[str] = ("write_artifact",),
        negative_env: Mapping[str, str] | None = None,
        effects: Callable[[Path], Any] | None = None,
    ) -> None:
        if (plan is None) == (workflow is None):
            raise ValueError("give a plan or a workflow, not both or neither")
        self.files = dict(files or {})
        for relpath in self.files:
            # A leading slash would write on the machine itself, at every case.
            if not relpath or os.path.isabs(relpath) or ".." in Path(relpath).parts:
                raise ValueError(f"files: {relpath!r} is not a path inside the scratch folder")
        self.env = dict(env or {})
        self.task_id = task_id
        self.artifact_tools = tuple(artifact_tools)
        self.effects = effects
        self.workflow = workflow
        self._plan: dict[str, Any] | None = None
        if workflow is not None:
            positional = not isinstance(args, Mapping)
            value = list(args) if positional else dict(args)
            # Refused here as create would refuse it: NaN, infinities, what is not JSON.
            self.args = json.dumps(value, allow_nan=False, sort_keys=True)
            if tools is not None:
                self.env.setdefault("NINELIVES_TOOLS", tools)
            # A module beside the test file loads in every child process.
            folder = os.path.abspath(base or ".")
            inherited = self.env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
            self.env["PYTHONPATH"] = os.pathsep.join(p for p in (folder, inherited) if p)
        elif isinstance(plan, Mapping):
            self._plan = json.loads(json.dumps(plan))
        elif plan is not None:
            path = Path(base or ".") / Path(plan)
            self._plan = json.loads(path.read_text(encoding="utf-8"))
        if self._plan is not None:
            steps = self._plan.get("steps")
            if not isinstance(steps, list) or not steps:
                raise ValueError("the plan has no steps")
        if negative_env is None and workflow is None and "write_artifact" in self.tools:
            negative_env = {"AGENT_UNSAFE_EFFECTS": "1"}
        self.negative_env = dict(negative_env) if negative_env is not None else None
        self._baselines: dict[str, tuple[dict[str, str], Any]] = {}

    @property
    def plan(self) -> dict[str, Any]:
        """The plan; for a workflow, the steps its uninterrupted run called, as a plan's
        steps (``{"steps": [{"tool": NAME}, ...]}``), which every resumed run must match."""
        if self._plan is None:
            self._plan = self._discover()
        return self._plan

    @property
    def tools(self) -> list[str]:
        """The tool of each step (a workflow's: each step's name), in order."""
        return [str(step.get("tool")) for step in self.plan["steps"]]

    @property
    def subject(self) -> tuple[str, ...]:
        """What follows ``create TASK``: the plan file, or ``--workflow NAME --args JSON``."""
        if self.workflow is None:
            return ("plan.json",)
        return ("--workflow", self.workflow, "--args", self.args)

    def _discover(self) -> dict[str, Any]:
        """Run the workflow once, uninterrupted, in a scratch folder: its steps."""
        import shutil
        import tempfile

        folder = tempfile.mkdtemp(prefix="ninelives-kit-")
        try:
            lab = self.lab(folder)
            _expect(lab.cli("create", self.task_id, *self.subject), 0, "workflow create")
            _expect(lab.cli("run", self.task_id), 0, "workflow run")
            steps = lab.snapshot(self.task_id).status["steps"]
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if not steps:
            raise ValueError(f"workflow {self.workflow!r} called no step")
        return {"steps": [{"tool": step["tool"]} for step in steps]}

    # -- the cases ------------------------------------------------------------

    def cases(self) -> list[KillCase]:
        """Every case of this plan's kill matrix, in a stable order."""
        cases = [KillCase(kind="baseline")]
        cases += [KillCase(kind="crash", point=p) for p in TASK_POINTS]
        for idx, tool in enumerate(self.tools):
            cases += [KillCase(kind="crash", point=p, step=idx) for p in STEP_POINTS]
            if tool in self.artifact_tools:
                cases += [KillCase(kind="crash", point=p, step=idx) for p in ARTIFACT_POINTS]
        cases += [
            KillCase(kind="outside_kill"),
            KillCase(kind="lock"),
            KillCase(kind="negative_control"),
        ]
        return cases

    @property
    def last_step(self) -> int:
        """Index of the plan's last step."""
        return len(self.tools) - 1

    @property
    def effect_step(self) -> int:
        """The step the negative control kills after: the last publishing step, else the last."""
        found = [i for i, t in enumerate(self.tools) if t in self.artifact_tools]
        return found[-1] if found else self.last_step

    # -- running ----------------------------------------------------------------

    def lab(self, folder: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> Lab:
        """A scratch lab in ``folder`` with the plan and files written."""
        lab = Lab(Path(folder), base_env={**self.env, **(env or {})})
        for relpath, text in self.files.items():
            lab.write(relpath, text)
        if self.workflow is None:
            lab.write_plan(self.plan)
        return lab

    def expected_artifacts(
        self, folder: str | os.PathLike[str], env: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """What an uninterrupted run leaves in the artifacts folder (computed once
        per environment, in ``folder``)."""
        return self._baseline(folder, env)[0]

    def _baseline(
        self, folder: str | os.PathLike[str], env: Mapping[str, str] | None = None
    ) -> tuple[dict[str, str], Any]:
        """The artifacts and the ``effects`` of an uninterrupted run, once per environment."""
        key = json.dumps(sorted((env or {}).items()))
        if key not in self._baselines:
            lab = self.lab(folder, env)
            _expect(lab.cli("create", self.task_id, *self.subject), 0, "baseline create")
            _expect(lab.cli("run", self.task_id), 0, "baseline run")
            effects = self.effects(lab.root) if self.effects is not None else None
            self._baselines[key] = (lab.artifacts(), effects)
        return self._baselines[key]

    def check(self, case: KillCase, folder: str | os.PathLike[str]) -> Outcome:
        """Run ``case`` in ``folder`` (empty or new); raise AssertionError if it fails."""
        root = Path(folder)
        if case.kind == "negative_control":
            return self._negative_control(root)
        expected = self._baseline(root / "baseline")
        lab = self.lab(root / "case")
        try:
            outcome = self._drive(lab, case, expected)
        finally:
            lab.reap()
        if outcome.problems:
            raise AssertionError(
                f"{case.id}: the resumed task breaks its guarantees:\n  "
                + "\n  ".join(outcome.problems)
            )
        return outcome

    def _drive(self, lab: Lab, case: KillCase, expected: Baseline) -> Outcome:
        task = self.task_id
        if case.kind == "baseline":
            _expect(lab.cli("create", task, *self.subject), 0, "create")
            _expect(lab.cli("run", task), 0, "run")
            return self._finish(lab, None, 1, expected)
        if case.point == "create_before_commit":
            _expect(
                lab.cli("create", task, *self.subject, AGENT_CRASH_AT=case.point),
                KILLED,
                "create killed before its commit",
            )
            _expect(lab.cli("status", task), 1, "status after the killed create (nothing stored)")
            _expect(lab.cli("create", task, *self.subject), 0, "create again")
            _expect(lab.cli("run", task), 0, "run")
            return self._finish(lab, None, 1, expected)
        _expect(lab.cli("create", task, *self.subject), 0, "create")
        if case.kind == "outside_kill":
            return self._outside_kill(lab, expected)
        if case.kind == "lock":
            return self._lock(lab, expected)
        if case.point in ("recovery_before_commit", "after_recovery"):
            # Leave a step running first, so the recovery has something to do.
            crash = f"before_effect:{self.last_step}"
            _expect(lab.cli("run", task, AGENT_CRASH_AT=crash), KILLED, f"run killed at {crash}")
            before = lab.snapshot(task)
            _expect(
                lab.cli("run", task, AGENT_CRASH_AT=str(case.point)),
                KILLED,
                f"run killed at {case.point}",
            )
            runs = 2
            if case.point == "recovery_before_commit":
                if lab.snapshot(task) != before:
                    return Outcome(
                        after=before,
                        artifacts=lab.artifacts(),
                        problems=["the recovery killed before its commit changed the database"],
                    )
            else:
                runs = 3
            _expect(lab.cli("run", task), 0, "resume")
            return self._finish(lab, before, runs, expected)
        crash = f"{case.point}:{case.step}"
        _expect(lab.cli("run", task, AGENT_CRASH_AT=crash), KILLED, f"run killed at {crash}")
        before = lab.snapshot(task)
        _expect(lab.cli("run", task), 0, "resume")
        return self._finish(lab, before, 2, expected)

    def _hold(self, lab: Lab, step: int, delay: str) -> Any:
        proc = lab.spawn("run", self.task_id, AGENT_STEP_DELAY=delay)
        try:
            _wait_started(lab, self.task_id, step, proc)
        except AssertionError:
            Lab.kill(proc)
            raise
        return proc

    def _outside_kill(self, lab: Lab, expected: Baseline) -> Outcome:
        step = min(1, self.last_step)
        proc = self._hold(lab, step, OUTSIDE_DELAY)
        code = Lab.kill(proc)
        if code != KILLED:
            raise AssertionError(f"the run killed from outside exited {code}, not -9")
        before = lab.snapshot(self.task_id)
        if step not in before.steps_with("running"):
            raise AssertionError(f"the outside kill did not land while step {step} ran")
        _expect(lab.cli("run", self.task_id), 0, "resume")
        return self._finish(lab, before, 2, expected)

    def _lock(self, lab: Lab, expected: Baseline) -> Outcome:
        proc = self._hold(lab, 0, HOLD_DELAY)
        started = time.monotonic()
        second = lab.cli("run", self.task_id, timeout=60)
        waited = time.monotonic() - started
        problems = []
        if second.returncode != 3:
            problems.append(f"a second runner exited {second.returncode}, not 3 (busy)")
        if waited > 10:
            problems.append(f"the second runner waited {waited:.1f}s instead of refusing at once")
        Lab.kill(proc)
        before = lab.snapshot(self.task_id)
        _expect(lab.cli("run", self.task_id), 0, "resume")
        outcome = self._finish(lab, before, 2, expected)
        return Outcome(
            after=outcome.after, artifacts=outcome.artifacts, problems=problems + outcome.problems
        )

    def _finish(self, lab: Lab, before: Snapshot | None, runs: int, expected: Baseline) -> Outcome:
        after = lab.snapshot(self.task_id)
        artifacts = lab.artifacts()
        problems = five_property_violations(
            plan=self.plan,
            after=after,
            before=before,
            runs=runs,
            artifacts=artifacts,
            expected_artifacts=expected[0],
        )
        if self.effects is not None:
            effects = self.effects(lab.root)
            if effects != expected[1]:
                problems.append(f"effects {effects!r} != expected {expected[1]!r}")
        verified = lab.cli("verify", self.task_id, "--artifacts", str(lab.artifacts_dir))
        if verified.returncode != 0:
            problems.append(
                f"ninelives verify exited {verified.returncode}: {verified.stdout.strip()}"
            )
        return Outcome(after=after, artifacts=artifacts, problems=problems)

    def _negative_control(self, root: Path) -> Outcome:
        """The checks must fail when the effect is not idempotent (or a duplicate is planted)."""
        step = self.effect_step
        env = self.negative_env
        if env is not None:
            expected = self._baseline(root / "baseline-unsafe", env)
            lab = self.lab(root / "case", env)
            _expect(lab.cli("create", self.task_id, *self.subject), 0, "create")
            crash = f"after_effect:{step}"
            _expect(
                lab.cli("run", self.task_id, AGENT_CRASH_AT=crash),
                KILLED,
                f"unsafe run killed at {crash}",
            )
            before = lab.snapshot(self.task_id)
            _expect(lab.cli("run", self.task_id), 0, "unsafe resume")
            outcome = self._finish(lab, before, 2, expected)
            what = f"with {env} the effect of step {step} ran twice"
        else:
            expected = self._baseline(root / "baseline")
            lab = self.lab(root / "case")
            _expect(lab.cli("create", self.task_id, *self.subject), 0, "create")
            _expect(lab.cli("run", self.task_id), 0, "run")
            name = next(iter(expected[0]), "planted.md")
            lab.write(
                str(lab.artifacts_dir.relative_to(lab.root) / f"copy-of-{name}"),
                expected[0].get(name, "planted"),
            )
            outcome = self._finish(lab, None, 1, expected)
            what = "a duplicate artifact was planted"
        if not outcome.problems:
            raise AssertionError(
                f"negative control: {what}, yet every check passed: the kills do not reach "
                "the dangerous window, or the checks cannot see duplicates"
            )
        return outcome


def _wait_started(lab: Lab, task_id: str, step: int, proc: Any, timeout: float = 60) -> None:
    """Wait until ``step_started`` of ``step`` is committed. Reads the SQLite file
    directly (milliseconds per poll) rather than through the CLI."""
    path = lab.sqlite_path
    if path is None:
        lab.wait_for(task_id, "step_started", step, timeout=timeout)
        return
    import sqlite3

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the run exited {proc.returncode} before step {step} started")
        if path.exists():
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
            try:
                row = conn.execute(
                    "SELECT 1 FROM events WHERE task_id = ? AND kind = 'step_started' "
                    "AND step_idx = ?",
                    (task_id, step),
                ).fetchone()
            except sqlite3.Error:
                row = None  # the schema may not be there yet
            finally:
                conn.close()
            if row is not None:
                return
        time.sleep(0.01)
    raise AssertionError(f"step {step} did not start within {timeout}s")


def _expect(result: Any, code: int, what: str) -> None:
    if result.returncode != code:
        raise AssertionError(
            f"{what}: exit {result.returncode}, expected {code}\n"
            f"stdout: {result.stdout.strip()}\nstderr: {result.stderr.strip()}"
        )


@dataclass(frozen=True)
class BoundCase:
    """A case together with its kit: what a ``ninelives_case`` argument receives."""

    kit: KillKit
    case: KillCase

    @property
    def id(self) -> str:
        """The case id."""
        return self.case.id

    def check(self, folder: str | os.PathLike[str]) -> Outcome:
        """Run the case in ``folder``; raise AssertionError if it fails."""
        return self.kit.check(self.case, folder)


def bound_cases(kit: KillKit) -> list[BoundCase]:
    """Every case of ``kit``, bound to it."""
    return [BoundCase(kit, case) for case in kit.cases()]


def kill_matrix(
    plan: str | os.PathLike[str] | Mapping[str, Any] | None = None, **options: Any
) -> Callable[..., None]:
    """A pytest test function that runs every case of ``plan``'s kill matrix
    (or, with ``workflow=NAME``, of that workflow's).

    Assign it to a ``test_*`` name in a test module. A relative plan path is
    resolved against the calling module's folder, which is also where a
    workflow's module is found; ``options`` are those of :class:`KillKit`.
    """
    import pytest

    frame = inspect.currentframe()
    caller = frame.f_back if frame is not None else None
    if "base" not in options and caller is not None:
        options["base"] = os.path.dirname(os.path.abspath(caller.f_code.co_filename))
    cases = bound_cases(KillKit(plan, **options))

    @pytest.mark.parametrize("ninelives_case", cases, ids=[c.id for c in cases])
    def test_kill_matrix(ninelives_case: BoundCase, tmp_path: Path) -> None:
        ninelives_case.check(tmp_path)

    return test_kill_matrix
