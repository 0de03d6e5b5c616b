"""The kill-test kit and its pytest plugin, run the way a user runs them: a separate
pytest session over a project of their own. examples/kill-test-kit itself is
installed and run as its README says by test_kit_readme.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ninelives.testing.kit import KillKit
from ninelives.testing.lab import GUIDE_PLAN, SUMMARY_NOTES

pytestmark = pytest.mark.crash

INI = "[pytest]\naddopts = --strict-markers -p no:cacheprovider\nfilterwarnings = error\n"
#: The guide's plan: 1 baseline + 3 task points + 3 steps x 3 points + 2 artifact
#: points of write_artifact + outside kill + lock + negative control.
GUIDE_CASES = 18


def _pytest(project: Path, *args: str, pythonpath: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "PYTEST_"))}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _project(root: Path, test: str, *, ini: str = INI) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pytest.ini").write_text(ini, encoding="utf-8")
    (root / "plan.json").write_text(json.dumps(GUIDE_PLAN), encoding="utf-8")
    (root / "test_plan.py").write_text(textwrap.dedent(test), encoding="utf-8")
    return root


MARKED = """
import pytest

@pytest.mark.ninelives("plan.json", files={"input/notes.txt": NOTES})
def test_plan(ninelives_case, tmp_path):
    ninelives_case.check(tmp_path)
""".replace("NOTES", repr(SUMMARY_NOTES))


@pytest.mark.slow
def test_the_marker_generates_every_case(tmp_path: Path) -> None:
    project = _project(tmp_path / "marked", MARKED)
    listed = _pytest(project, "--collect-only")
    ids = re.findall(r"test_plan\[([^\]]+)\]", listed.stdout)
    assert ids == [c.id for c in KillKit(GUIDE_PLAN).cases()], listed.stdout
    assert len(ids) == GUIDE_CASES
    assert {"after_effect-step2", "artifact_before_link-step2", "lock"} <= set(ids)
    ran = _pytest(project, "-k", "baseline or after_effect-step2 or outside_kill or negative")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "4 passed" in ran.stdout


@pytest.mark.slow
def test_the_ini_option_names_the_plan(tmp_path: Path) -> None:
    test = """
    def test_plan(ninelives_case, tmp_path):
        ninelives_case.check(tmp_path)
    """
    project = _project(tmp_path / "ini", test, ini=INI + "ninelives_plan = plan.json\n")
    listed = _pytest(project, "--collect-only")
    assert f"{GUIDE_CASES} tests collected" in listed.stdout, listed.stdout


@pytest.mark.slow
def test_a_case_without_a_plan_is_a_usage_error(tmp_path: Path) -> None:
    test = """
    def test_plan(ninelives_case):
        pass
    """
    project = _project(tmp_path / "noplan", test)
    result = _pytest(project)
    assert result.returncode != 0
    assert "names no plan" in result.stdout + result.stderr


NOT_IDEMPOTENT = """
from ninelives.testing import kill_matrix

test_plan = kill_matrix(
    "plan.json",
    files={"input/notes.txt": NOTES},
    env={"AGENT_UNSAFE_EFFECTS": "1"},
)
""".replace("NOTES", repr(SUMMARY_NOTES))


@pytest.mark.slow
def test_negative_control_the_kit_fails_a_tool_that_is_not_idempotent(tmp_path: Path) -> None:
    """With every run appending (AGENT_UNSAFE_EFFECTS=1), the kill after the effect
    must fail: the resumed task wrote its text twice."""
    project = _project(tmp_path / "unsafe", NOT_IDEMPOTENT)
    result = _pytest(project, "-k", "after_effect-step2 or before_effect-step2")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed, 1 passed" in result.stdout, result.stdout
    assert "FAILED test_plan.py::test_plan[after_effect-step2]" in result.stdout
    assert "report.log" in result.stdout


PLAIN = """
import sys

def test_plain():
    assert "ninelives.testing.plugin" in sys.modules       # loaded by its entry point
    for heavy in ("ninelives.testing.kit", "ninelives.testing.lab", "ninelives.runtime",
                  "sqlite3"):
        assert heavy not in sys.modules, heavy
"""


@pytest.mark.slow
def test_the_plugin_stays_out_of_sessions_that_do_not_use_it(tmp_path: Path) -> None:
    project = _project(tmp_path / "plain", PLAIN)
    result = _pytest(project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
    markers = _pytest(project, "--markers")
    assert "@pytest.mark.ninelives(plan, **options)" in markers.stdout
