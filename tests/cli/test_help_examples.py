"""Every command's ``--help`` ends with an example that starts with ``ninelives``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ninelives.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]


def _help(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ninelives", *args, "--help"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_commands_help_ends_with_an_example(command: str) -> None:
    lines = _help(command).rstrip("\n").splitlines()
    assert lines[-2] == "example:", lines[-3:]
    assert "ninelives " in lines[-1]
    # An example may first go where its paths hold: "cd examples/demo && ninelives ...".
    shown = (
        lines[-1].lstrip().split(" && ", 1)[-1]
        if lines[-1].lstrip().startswith("cd ")
        else lines[-1]
    )
    assert shown.lstrip().split()[0] in ("ninelives", "NINELIVES_DB=postgresql://db/ninelives")


@pytest.mark.parametrize("command", ["create", "torture"])
def test_the_demo_examples_work_as_shown_from_the_checkouts_root(
    command: str, tmp_path: Path
) -> None:
    """``create demo examples/demo/plan.json`` from the root stored a task whose
    ``fetch input/notes.txt`` then failed every attempt of ``run demo``."""
    example = _help(command).rstrip("\n").splitlines()[-1].strip()
    if command == "torture":  # the same place and plan, fewer kills
        example = example.replace("--kills 20", "--kills 1")
    root = tmp_path / "checkout"
    shutil.copytree(ROOT / "examples" / "demo", root / "examples" / "demo")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "NINELIVES_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    then = " && ninelives run demo" if command == "create" else ""
    done = subprocess.run(
        ["bash", "-c", example + then], cwd=root, env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warning" not in done.stderr
    if command == "create":
        artifacts = list(root.rglob("demo-2.md"))
        assert len(artifacts) == 1, artifacts


def test_the_main_help_ends_with_an_example() -> None:
    lines = _help().rstrip("\n").splitlines()
    assert lines[-2] == "example:"
    assert lines[-1].strip().startswith("ninelives create demo plan.json")
