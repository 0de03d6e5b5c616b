"""The kill matrix of a framework agent inside a workflow, through the CLI.

The agent modules (``pai_notes.py``, ``oai_notes.py``) make the same run: a
model call asking for two tools (``read_note``, ``post_note``), the two tool
calls, a model call answering; then the workflow's own ``report`` step. Each
module logs every model call and tool execution to ``$NOTES_LOG``: the counts
say what ran again after a kill.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from ninelives.testing import Lab

HERE = Path(__file__).resolve().parent
POINTS = ("before_effect", "after_effect", "after_commit")
#: What each step of the run executes (the key its log line counts under).
STEPS = ("model", "tool:read_note", "tool:post_note", "model", "report")
#: The framework's own steps: the matrix kills at every point of each.
AGENT_STEPS = range(4)
BASELINE = Counter({"model": 2, "tool:read_note": 1, "tool:post_note": 1, "report": 1})
QUESTION = "What do my notes say?"


def setup(lab: Lab, module: str) -> None:
    """Copy the agent module into the lab and name it as the tools module."""
    shutil.copy(HERE / f"{module}.py", lab.root / f"{module}.py")
    lab.base_env["NINELIVES_TOOLS"] = module
    lab.write("input/a.txt", "buy milk\n")


def ran(lab: Lab, task: str) -> Counter[str]:
    """What ran for ``task``, by kind (the post's key dropped)."""
    path = lab.root / f"calls-{task}.log"
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return Counter(line.split(" ")[0] for line in lines)


def create(lab: Lab, task: str, workflow: str) -> None:
    made = lab.cli("create", task, "--workflow", workflow, "--args", json.dumps([QUESTION]))
    assert made.returncode == 0, made.stderr


def run(lab: Lab, task: str, **env: str) -> Any:
    return lab.cli("run", task, NOTES_LOG=f"calls-{task}.log", **env)


def result(lab: Lab, task: str) -> str:
    """The task's result as JSON text, its own id written ``TASK`` (keys hold it)."""
    status = lab.cli("status", task, "--json")
    assert status.returncode == 0, status.stderr
    found = status.json()
    assert found["status"] == "done", found
    return json.dumps(found["result"], sort_keys=True).replace(task, "TASK")


def baseline(lab: Lab, workflow: str) -> str:
    """An uninterrupted run's result, after checking what it ran."""
    task = f"{workflow}-base"
    create(lab, task, workflow)
    done = run(lab, task)
    assert done.returncode == 0, done.stderr
    assert ran(lab, task) == BASELINE
    return result(lab, task)


def kill_and_resume(lab: Lab, workflow: str, point: str, k: int, expected: str) -> list[str]:
    """Kill the run at ``point`` of step ``k``, resume it, and list what broke:
    a repeated model call or tool execution, a note posted twice, another final
    output, an unclean ``verify``."""
    task = f"{workflow}-{point}-{k}".replace("_", "-")
    create(lab, task, workflow)
    killed = run(lab, task, AGENT_CRASH_AT=f"{point}:{k}")
    problems = []
    if killed.returncode != -9:
        problems.append(f"the run was not killed at {point}:{k}: exit {killed.returncode}")
    resumed = run(lab, task)
    if resumed.returncode != 0:
        return [*problems, f"the resume exited {resumed.returncode}: {resumed.stderr.strip()}"]
    want = BASELINE.copy()
    if point == "after_effect":
        want[STEPS[k]] += 1  # the killed call ran, its done commit did not: once more
    got = ran(lab, task)
    if got != want:
        problems.append(f"ran {dict(got)}, expected {dict(want)}")
    notes = sorted(p.name for p in (lab.root / "notes").glob(f"{task}-*.txt"))
    if len(notes) != 1:
        problems.append(f"notes posted: {notes}")
    final = result(lab, task)
    if final != expected:
        problems.append(f"result {final} differs from {expected}")
    verified = lab.cli("verify", task)
    if verified.returncode != 0:
        problems.append(f"verify exited {verified.returncode}: {verified.stdout}{verified.stderr}")
    return problems
