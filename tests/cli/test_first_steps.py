"""What a new user meets first: the demo script, the words the command prints,
``status --outputs`` on a terminal, torture of a plan that cannot run."""

from __future__ import annotations

import importlib.util
import os
import pty
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from ninelives.testing import Lab

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_script_takes_the_relative_paths_make_passes(tmp_path: Path) -> None:
    """`make demo` once passed `.venv/bin/ninelives`, relative to the checkout, to a
    script that changes folder before using it: exit 127 on every fresh clone."""
    ninelives = Path(sys.executable).with_name("ninelives")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "NINELIVES_"))}
    env["NINELIVES"] = os.path.relpath(ninelives, ROOT)
    env["DEMO_DIR"] = os.path.relpath(tmp_path / "demo", ROOT)
    result = subprocess.run(
        ["bash", "scripts/demo.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "step_recovered events: 1; artifacts: 1" in result.stdout
    assert sorted(os.listdir(tmp_path / "demo" / "artifacts")) == ["demo-2.md"]


def test_create_counts_steps_in_words(lab: Lab) -> None:
    lab.write("input/notes.txt", "one line\n")
    lab.write_plan(
        {"goal": "one", "steps": [{"tool": "fetch", "input": {"path": "input/notes.txt"}}]}
    )
    assert lab.cli("create", "a", "plan.json").stdout == "created task 'a' with 1 step\n"
    lab.guide_setup()
    assert lab.cli("create", "b", "plan.json").stdout == "created task 'b' with 3 steps\n"


def _on_a_terminal(lab: Lab, *args: str) -> str:
    """Run a command with its stdout on a pseudo-terminal; return what it printed."""
    leader, follower = pty.openpty()
    try:
        proc = subprocess.run(
            lab.argv(args), cwd=lab.root, env=lab.env(), stdout=follower,
            stderr=subprocess.PIPE, timeout=60, check=False,
        )  # fmt: skip
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the other side is closed and drained
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
    assert proc.returncode == 0, proc.stderr
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_status_outputs_on_a_terminal_is_a_table(sqlite_lab: Lab) -> None:
    lab = sqlite_lab
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    assert lab.cli("run", "t").returncode == 0
    shown = _on_a_terminal(lab, "status", "t", "--outputs")
    assert not shown.lstrip().startswith("{"), shown
    assert shown.startswith("task t: done")
    assert "write_artifact" in shown
    assert '"artifacts/t-2.md"' in shown  # each output key on its own line
    piped = lab.cli("status", "t", "--outputs").json()  # not a terminal: JSON, as before
    assert piped["steps"][2]["output"]["path"] == "artifacts/t-2.md"
    assert _on_a_terminal(lab, "status", "t", "--outputs", "--json").lstrip().startswith("{")


def test_torture_of_a_plan_that_cannot_run_leaves_no_scratch_folder(
    sqlite_lab: Lab, tmp_path: Path
) -> None:
    lab = sqlite_lab
    lab.write_plan(
        {"goal": "g", "steps": [{"tool": "fetch", "input": {"path": "input/notes.txt"}}]}
    )
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    result = lab.cli("torture", "plan.json", "--kills", "2", TMPDIR=str(scratch))
    assert result.returncode == 2, result.stderr
    assert "does not run cleanly even without kills" in result.stderr
    assert list(scratch.iterdir()) == []


def _reliability() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reliability", ROOT / "bench" / "reliability.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["reliability"] = module
    spec.loader.exec_module(module)
    return module


def test_the_reliability_notes_speak_words_not_tuples() -> None:
    bench = _reliability()
    assert bench.codes_in_words({6: 170, 0: 34, 5: 16}) == (
        "170 runs exit 6 (outcome unknown), 34 runs exit 0 (done), "
        "16 runs exit 5 (database unusable)"
    )
    assert bench.sequences_in_words([(6, 0), (6, 0), (0,)]) == (
        "2 cases: exit 6 (outcome unknown), then exit 0 (done); 1 case: exit 0 (done)"
    )
