"""A write command refused before it writes leaves an older database at its version.

The first command that writes migrates an older file, and an older ninelives then
refuses it. A command naming a task the file does not hold (a typo) writes
nothing, so it must not migrate either: the file stays byte-for-byte what it was,
still readable by the version that wrote it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ninelives.store import sql

pytestmark = pytest.mark.crash

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "schema"
LATEST = sql.migrations("sqlite")[-1][0]
OLDER = sorted(
    int(p.name[1:])
    for p in FIXTURES.glob("v*")
    if (p / "state.db").is_file() and int(p.name[1:]) < LATEST
)

#: Every command that writes to one named task (the last word is the unknown id's place).
COMMANDS = [
    ["run", "nosuch"],
    ["retry", "nosuch"],
    ["cancel", "nosuch"],
    ["fork", "nosuch", "copy", "--from", "0"],
    ["approve", "nosuch", "0"],
    ["resolve", "nosuch", "0", "--retry"],
]


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


@pytest.mark.parametrize("version", OLDER)
def test_an_unknown_task_does_not_migrate(version: int, tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    shutil.copyfile(FIXTURES / f"v{version}" / "state.db", db)
    before = digest(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NINELIVES_", "AGENT_"))}
    for command in COMMANDS:
        proc = subprocess.run(
            [sys.executable, "-m", "ninelives", "--db", str(db), *command],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 1, (command, proc.stderr)
        assert proc.stderr == "ninelives: error: unknown task 'nosuch'\n", command
        assert digest(tmp_path) == before, f"{command[0]} migrated version {version}"


#: Commands each refused before it writes, for a reason the task as stored gives
#: (tasks every fixture holds: ``done``, ``pending``, ``failed``).
REFUSED = [
    ["retry", "done"],
    ["retry", "failed", "--step", "2"],
    ["cancel", "done"],
    ["cancel", "pending", "--reason", "x" * 5000],
    ["fork", "pending", "copy", "--from", "2"],
    ["fork", "done", "copy", "--from", "9"],
    ["fork", "done", "bad/id", "--from", "1"],
    ["fork", "done", "copy", "--from", "1", "--queue", "bad queue"],
    ["approve", "pending", "0"],
    ["resolve", "pending", "0", "--retry"],
    ["resolve", "pending", "0", "--done", "[1]"],
    ["resolve", "pending", "0", "--done", "{"],
]


def cli(db: Path, *command: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NINELIVES_", "AGENT_"))}
    return subprocess.run(
        [sys.executable, "-m", "ninelives", "--db", str(db), *command],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize("version", OLDER)
def test_a_refused_command_does_not_migrate(version: int, tmp_path: Path) -> None:
    """Each refusal is the one a current file gets (the same line and exit code),
    answered from the task as the older file holds it, the file left unchanged."""
    import ninelives

    older, current = tmp_path / "older", tmp_path / "current"
    for folder in (older, current):
        folder.mkdir()
        shutil.copyfile(FIXTURES / f"v{version}" / "state.db", folder / "state.db")
    ninelives.open(str(current / "state.db")).close()  # migrated: what this version says
    before = digest(older)
    for command in REFUSED:
        want = cli(current / "state.db", *command)
        assert want.returncode == 4, (command, want.stderr)
        got = cli(older / "state.db", *command)
        assert (got.returncode, got.stderr) == (want.returncode, want.stderr), command
        assert digest(older) == before, f"{command} migrated version {version}"
