"""Every command's ``--help`` ends with an example that starts with ``ninelives``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ninelives.cli import COMMANDS


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
    assert lines[-1].lstrip().split()[0] in ("ninelives", "NINELIVES_DB=postgresql://db/ninelives")


def test_the_main_help_ends_with_an_example() -> None:
    lines = _help().rstrip("\n").splitlines()
    assert lines[-2] == "example:"
    assert lines[-1].strip().startswith("ninelives create demo plan.json")
