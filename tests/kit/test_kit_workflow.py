"""The kill-test kit on a user's own workflow, run the way a user runs it: a separate
pytest session over a project with a workflow module and one ``kill_matrix`` call."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_kit import INI, _pytest

from ninelives.testing.kit import KillKit

pytestmark = pytest.mark.crash

NOTES = "Buy milk\nCall Ann\nShip the release\n"
FLOWS = '''
import os

import ninelives
from ninelives.tools.effects import artifacts_folder, publish_once


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


@ninelives.step(name="publish")
def publish(text):
    """Once in outcome by its key; FLOW_UNSAFE=1 appends instead (the deliberate bug)."""
    step = ninelives.current_step()
    folder = artifacts_folder()
    if os.environ.get("FLOW_UNSAFE") == "1":
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "flow.log"), "a", encoding="utf-8") as log:
            log.write(text)
        return {"path": os.path.join(folder, "flow.log")}
    done = publish_once(folder, f"{step.idem_key}.md", text.encode(), step=step.step)
    return {"path": done.path, "sha256": done.sha256, "bytes": done.size}


@ninelives.workflow("shout_flow")
def shout_flow(ctx, path):
    text = ctx.step("read", read, path)
    loud = ctx.step("shout", str.upper, text)
    return publish(loud)
'''
MATRIX = f"""
from ninelives.testing import kill_matrix

test_flow = kill_matrix(
    workflow="shout_flow",
    args=["input/notes.txt"],
    tools="flows",
    files={{"input/notes.txt": {NOTES!r}}},
    artifact_tools=["publish"],
    negative_env={{"FLOW_UNSAFE": "1"}},
)
"""
#: 1 baseline + 3 task points + 3 steps x 3 points + 2 artifact points of publish
#: + outside kill + lock + negative control.
FLOW_CASES = 18


def _project(root: Path, test: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pytest.ini").write_text(INI, encoding="utf-8")
    (root / "flows.py").write_text(FLOWS, encoding="utf-8")
    (root / "test_flow.py").write_text(textwrap.dedent(test), encoding="utf-8")
    return root


def test_every_case_of_a_workflow_passes(tmp_path: Path) -> None:
    project = _project(tmp_path / "flow", MATRIX)
    listed = _pytest(project, "--collect-only")
    ids = re.findall(r"test_flow\[([^\]]+)\]", listed.stdout)
    assert len(ids) == FLOW_CASES, listed.stdout + listed.stderr
    assert ids[:4] == ["baseline", "create_before_commit", "recovery_before_commit",
                       "after_recovery"]  # fmt: skip
    assert {"after_effect-step0", "after_commit-step1", "artifact_before_link-step2"} <= set(ids)
    assert ids[-3:] == ["outside_kill", "lock", "negative_control"]
    ran = _pytest(project)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"{FLOW_CASES} passed" in ran.stdout


def test_negative_control_the_kit_fails_a_workflow_step_that_is_not_idempotent(
    tmp_path: Path,
) -> None:
    """Every run appending (FLOW_UNSAFE=1 for all of them): the kill after the effect
    of the publishing step must fail, the kill before it pass."""
    unsafe = MATRIX.replace('tools="flows",', 'tools="flows",\n    env={"FLOW_UNSAFE": "1"},')
    project = _project(tmp_path / "unsafe", unsafe)
    result = _pytest(project, "-k", "after_effect-step2 or before_effect-step2")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed, 1 passed" in result.stdout, result.stdout
    assert "FAILED test_flow.py::test_flow[after_effect-step2]" in result.stdout
    assert "flow.log" in result.stdout


def test_a_resumed_run_that_calls_other_steps_fails_the_case(tmp_path: Path) -> None:
    """Negative control of the step check: a workflow that reads a file between steps
    (what the docs forbid) and so calls one more step when run again passes its
    baseline and fails the kill whose resumed run calls another list of steps."""
    moody = (
        FLOWS
        + """

def _runs():
    count = int(open("runs").read()) + 1 if os.path.exists("runs") else 1
    with open("runs", "w") as f:
        f.write(str(count))
    return count


@ninelives.workflow("moody")
def moody(ctx):
    again = _runs() > 1
    ctx.step("first", str, "a")
    out = ctx.step("last", str, "c")
    if again:
        ctx.step("extra", str, "b")
    return out
"""
    )
    test = MATRIX.replace('"shout_flow"', '"moody"').replace('args=["input/notes.txt"],', "")
    project = _project(tmp_path / "moody", test)
    (project / "flows.py").write_text(moody, encoding="utf-8")
    result = _pytest(project, "-k", "baseline or after_effect-step1")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed, 1 passed" in result.stdout, result.stdout
    assert "FAILED test_flow.py::test_flow[after_effect-step1]" in result.stdout
    assert "plan changed: ['first', 'last', 'extra'] != ['first', 'last']" in result.stdout


def test_the_marker_takes_a_workflow(tmp_path: Path) -> None:
    test = f"""
    import pytest

    @pytest.mark.ninelives(workflow="shout_flow", args=["input/notes.txt"], tools="flows",
                           files={{"input/notes.txt": {NOTES!r}}}, artifact_tools=["publish"])
    def test_flow(ninelives_case, tmp_path):
        ninelives_case.check(tmp_path)
    """
    project = _project(tmp_path / "marked", test)
    result = _pytest(project, "-k", "after_effect-step2 or negative_control")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


def test_bad_kit_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="not both or neither"):
        KillKit()
    with pytest.raises(ValueError, match="not both or neither"):
        KillKit({"steps": [{"tool": "fetch"}]}, workflow="w")
    with pytest.raises(ValueError, match="Out of range float"):
        KillKit(workflow="w", args=[float("nan")])


@pytest.mark.parametrize("path", ["/input/notes.txt", "../notes.txt", "input/../../x", ""])
def test_a_file_outside_the_scratch_folder_is_refused(path: str) -> None:
    # A leading slash (a typo for "input/notes.txt") wrote /input/notes.txt on the
    # machine running the tests, and ".." above the scratch folder, at each case.
    with pytest.raises(ValueError, match="inside the scratch folder"):
        KillKit({"steps": [{"tool": "fetch", "input": {"path": "x"}}]}, files={path: "x"})


def test_a_workflow_that_fails_its_baseline_says_so(tmp_path: Path) -> None:
    project = _project(tmp_path / "missing", MATRIX.replace('"shout_flow"', '"nope"'))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--collect-only"],
        cwd=project, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "workflow create: exit 4" in result.stdout + result.stderr


OUTBOX = """
import os

import ninelives


@ninelives.step(name="send")
def send(text):
    # An effect outside the artifacts folder, kept once per key (OUTBOX_UNSAFE=1: always).
    key = ninelives.current_step().idem_key
    os.makedirs("outbox", exist_ok=True)
    log = os.path.join("outbox", "sent.log")
    lines = open(log, encoding="utf-8").read().splitlines() if os.path.exists(log) else []
    if os.environ.get("OUTBOX_UNSAFE") == "1" or not any(l.startswith(key + " ") for l in lines):
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{key} {text}\\n")
    return {"sent": key}


@ninelives.workflow("mailer")
def mailer(ctx, to):
    body = ctx.step("compose", str.upper, "hello " + to)
    return send(body)
"""
EFFECTS = """
from pathlib import Path

from ninelives.testing import kill_matrix


def sent(root: Path):
    log = root / "outbox" / "sent.log"
    return log.read_text(encoding="utf-8").splitlines() if log.exists() else []


test_flow = kill_matrix(workflow="mailer", args=["ann"], tools="flows", effects=sent{env})
"""


@pytest.mark.parametrize(("env", "outcome"), [("", "2 passed"), ("OUTBOX_UNSAFE", "1 failed")])
def test_effects_outside_the_artifacts_folder_are_compared(
    tmp_path: Path, env: str, outcome: str
) -> None:
    """``effects=`` reads what the steps did elsewhere; the control (every run sending
    again) fails the kill after the send, and passes the kill before it."""
    extra = f", env={{'{env}': '1'}}" if env else ""
    project = _project(tmp_path / "outbox", EFFECTS.format(env=extra))
    (project / "flows.py").write_text(OUTBOX, encoding="utf-8")
    result = _pytest(project, "-k", "before_effect-step1 or after_effect-step1")
    assert outcome in result.stdout, result.stdout + result.stderr
    if env:
        assert "FAILED test_flow.py::test_flow[after_effect-step1]" in result.stdout
        assert "effects ['kill-test-1 HELLO ANN', 'kill-test-1 HELLO ANN'] != expected" in (
            result.stdout
        )
