"""Paths and names a new user's shell can hand the command, met where they
reach the database: each is one line on stderr, a documented exit code, no
traceback, and the stored state exactly as it was.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from ninelives.testing import Lab, Result

#: A folder named in Latin-1 on a UTF-8 system: ``café`` as the bytes
#: ``caf\xe9``, which Python hands over as a lone surrogate.
LATIN1 = os.fsdecode(b"caf\xe9")


def one_line(result: Result, code: int, *words: str) -> None:
    """Exit ``code``, one ``ninelives: error:`` line holding ``words``, no traceback."""
    assert result.returncode == code, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ninelives: error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def seeded(sqlite_lab: Lab) -> Lab:
    """Task ``keep`` done and task ``todo`` pending, in ``state.db``."""
    sqlite_lab.guide_setup()
    assert sqlite_lab.cli("create", "keep", "plan.json").returncode == 0
    assert sqlite_lab.cli("run", "keep", "-q").returncode == 0
    assert sqlite_lab.cli("create", "todo", "plan.json").returncode == 0
    return sqlite_lab


def test_an_artifacts_folder_not_named_in_utf8_is_exit_4(seeded: Lab) -> None:
    # The folder is stored as text with the task; its name cannot be encoded
    # as UTF-8, so create, submit and a run adopting it raised UnicodeEncodeError
    # from the driver: a traceback and exit 1, the code of "unknown task".
    folder = str(seeded.root / LATIN1)
    before = digest(seeded.root / "state.db")
    for args in (
        ("create", "new", "plan.json"),
        ("submit", "new", "plan.json"),
        ("run", "todo"),
    ):
        one_line(seeded.cli(*args, AGENT_ARTIFACTS=folder), 4, "AGENT_ARTIFACTS", "UTF-8")
        assert digest(seeded.root / "state.db") == before, args
    assert not os.path.exists(folder)
    # Control: the same folder named in UTF-8 is taken.
    assert seeded.cli("create", "new", "plan.json", AGENT_ARTIFACTS="café").returncode == 0
