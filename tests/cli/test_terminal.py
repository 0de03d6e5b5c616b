"""The progress lines of ``run``: on a terminal (a real pseudo-terminal) and through a pipe.

Compared with golden files, times masked. Colour only on a terminal, never with
``NO_COLOR``; ``-q`` prints the outcome only; a step that checkpoints ``{"done", "total"}``
gets a live bar on a terminal and nothing else through a pipe.
``NINELIVES_UPDATE_GOLDEN=1`` rewrites the files.
"""

from __future__ import annotations

import os
import pty
import re
import subprocess
from pathlib import Path

from ninelives.testing import Lab

GOLDEN = Path(__file__).parent / "golden"


def _masked(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\x1b", "<ESC>")
    return re.sub(r"\b\d+(\.\d+)? (ms|s|min)\b", "<T>", text)


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("NINELIVES_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


def _on_a_terminal(lab: Lab, *args: str, **env: str) -> str:
    """Run the command with stdout and stderr on a new pseudo-terminal; what it showed."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        lab.argv(args), cwd=lab.root, env=lab.env({"TERM": "xterm", **env}),
        stdin=subprocess.DEVNULL, stdout=follower, stderr=follower,
    )  # fmt: skip
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: every writer closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(60) == 0
    return b"".join(chunks).decode()


def _interrupted(lab: Lab) -> None:
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    assert lab.cli("run", "t", AGENT_CRASH_AT="after_effect:1").returncode == -9


def test_a_resumed_run_on_a_terminal_is_coloured(sqlite_lab: Lab) -> None:
    _interrupted(sqlite_lab)
    shown = _masked(_on_a_terminal(sqlite_lab, "run", "t"))
    assert "<ESC>[32mdone<ESC>[0m in <T> <ESC>[33m(recovered)<ESC>[0m" in shown
    _golden("run-resumed.tty.txt", shown)


def test_the_same_run_through_a_pipe_has_no_colour(sqlite_lab: Lab) -> None:
    _interrupted(sqlite_lab)
    ran = sqlite_lab.cli("run", "t")
    assert ran.returncode == 0
    shown = _masked(ran.stderr)
    assert "<ESC>" not in shown
    assert "step 1 summarize done in <T> (recovered)" in shown
    _golden("run-resumed.pipe.txt", shown)


def test_no_color_turns_colour_off_on_a_terminal(sqlite_lab: Lab) -> None:
    _interrupted(sqlite_lab)
    shown = _masked(_on_a_terminal(sqlite_lab, "run", "t", NO_COLOR="1"))
    assert shown == (GOLDEN / "run-resumed.pipe.txt").read_text()


def test_quiet_prints_only_the_outcome_on_a_terminal(sqlite_lab: Lab) -> None:
    _interrupted(sqlite_lab)
    assert _masked(_on_a_terminal(sqlite_lab, "run", "t", "-q")) == "t: <ESC>[32mdone<ESC>[0m\n"


COUNTING_TOOLS = """
import time

from ninelives.tools import tool


@tool("count")
def count(step_input, ctx):
    for i in range(1, step_input["n"] + 1):
        time.sleep(0.15)  # over the bar's 0.1 s between redraws: every update is drawn
        ctx.checkpoint({"done": i, "total": step_input["n"]})
    return {"counted": step_input["n"]}


@tool("odd_progress")
def odd_progress(step_input, ctx):
    ctx.checkpoint(["not", "a", "count"])
    ctx.checkpoint({"done": True, "total": 3})
    return {"ok": True}
"""


def _counting(lab: Lab) -> None:
    lab.write("counting.py", COUNTING_TOOLS)
    lab.base_env["NINELIVES_TOOLS"] = "counting"
    steps = [{"tool": "count", "input": {"n": 5}}, {"tool": "odd_progress", "input": {}}]
    lab.write_plan({"goal": "count to five", "steps": steps}, "count.json")
    assert lab.cli("create", "c", "count.json").returncode == 0


def test_a_step_that_checkpoints_counts_shows_a_bar_on_a_terminal(sqlite_lab: Lab) -> None:
    _counting(sqlite_lab)
    shown = _masked(_on_a_terminal(sqlite_lab, "run", "c", NO_COLOR="1")).replace("\r", "<CR>")
    # Each redraw goes back to column 0 and clears the line; the done line replaces the bar.
    assert "<CR><ESC>[Kc: step 0 count [####################] 5/5  <T><CR><ESC>[Kc: step 0" in shown
    assert "odd_progress [" not in shown  # other shapes draw nothing
    _golden("run-progress.tty.txt", shown)


def test_through_a_pipe_there_is_no_bar(sqlite_lab: Lab) -> None:
    _counting(sqlite_lab)
    ran = sqlite_lab.cli("run", "c")
    assert ran.returncode == 0
    for mark in ("\r", "\x1b", "[#"):
        assert mark not in ran.stderr
    assert _masked(ran.stderr) == (
        'c: step 0 count done in <T> {"counted": 5}\n'
        'c: step 1 odd_progress done in <T> {"ok": true}\n'
        "c: done\n"
    )


def test_quiet_draws_no_bar_on_a_terminal(sqlite_lab: Lab) -> None:
    _counting(sqlite_lab)
    assert _masked(_on_a_terminal(sqlite_lab, "run", "c", "-q", NO_COLOR="1")) == "c: done\n"


def test_a_worker_draws_the_bar_too(sqlite_lab: Lab) -> None:
    _counting(sqlite_lab)
    assert sqlite_lab.cli("submit", "w", "count.json").returncode == 0
    shown = _on_a_terminal(sqlite_lab, "worker", "--drain", NO_COLOR="1")
    assert "\r\x1b[Kw: step 0 count [####################] 5/5  " in shown
    assert "\r\x1b[Kw: step 0 count done in " in shown
