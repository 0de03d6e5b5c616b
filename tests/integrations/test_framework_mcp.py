"""Tools an OpenAI Agents SDK agent gets from an MCP server are durable steps too.

The SDK turns an MCP server's tools into function tools at each turn, outside
``agent.tools``: the agent's one MCP tool call, killed with SIGKILL at every
crash point of every step and resumed, runs once (twice only after an
``after_effect`` kill of its own step), and is a step ``tool:post_note``.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter

import pytest
from agent_kills import HERE, POINTS, ran

from ninelives.testing import Lab

pytestmark = [pytest.mark.crash, pytest.mark.slow]

STEPS = ["model", "tool:post_note", "model"]


def test_an_mcp_tool_call_is_a_step_that_a_resume_never_repeats(sqlite_lab: Lab) -> None:
    lab = sqlite_lab
    for name in ("oai_mcp.py", "mcp_notes.py"):
        shutil.copy(HERE / name, lab.root / name)
    lab.base_env["NINELIVES_TOOLS"] = "oai_mcp"
    problems = {}
    for k in range(len(STEPS)):
        for point in POINTS:
            task = f"mcp-{point}-{k}".replace("_", "-")
            made = lab.cli("create", task, "--workflow", "notes_mcp", "--args", json.dumps(["q"]))
            assert made.returncode == 0, made.stderr
            log = f"calls-{task}.log"
            killed = lab.cli("run", task, NOTES_LOG=log, AGENT_CRASH_AT=f"{point}:{k}")
            resumed = lab.cli("run", task, NOTES_LOG=log)
            want = Counter(STEPS)
            if point == "after_effect":
                want[STEPS[k]] += 1  # the killed call ran, its done commit did not
            status = lab.cli("status", task, "--json").json()
            found = {
                "killed": killed.returncode,
                "resumed": resumed.returncode,
                "ran": ran(lab, task),
                "steps": [s["tool"] for s in status["steps"]],
                "answered": "posted remember the milk" in str(status.get("result")),
            }
            wanted = {
                "killed": -9,
                "resumed": 0,
                "ran": want,
                "steps": ["model:notes", "tool:post_note", "model:notes"],
                "answered": True,
            }
            if found != wanted:
                problems[f"{point}:{k}"] = found
    assert problems == {}
