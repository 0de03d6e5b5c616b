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
