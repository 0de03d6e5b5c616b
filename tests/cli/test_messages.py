"""The words of common mistakes: each names what is wrong, in the user's terms.

``verify`` without an argument, a database that does not exist (one rule for
every command), a database that cannot be written (a read-only file system),
and plan files that are empty or not JSON, named in the error.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from errorlines import one_line
from ninelives.testing import Lab
from ninelives.testing.iofault import SmallDiskUnavailable, small_disk


@pytest.mark.parametrize("command", ["verify", "replay-check"])
def test_a_check_says_what_to_give(sqlite_lab: Lab, command: str) -> None:
    neither = one_line(sqlite_lab.cli(command), 4)
    assert "give a TASK or --all" in neither
    assert "not both" not in neither  # replay-check said "not both" to neither
    both = one_line(sqlite_lab.cli(command, "t", "--all"), 4)
    assert "not both" in both


#: A command about one task answers "unknown task" (exit 1, as the contract has
#: status and run do); one about the whole database says there is none (exit 5).
ONE_TASK = [
    ("status", "t"), ("run", "t"), ("export", "t"), ("retry", "t"), ("cancel", "t"),
    ("fork", "t", "u", "--from", "0"), ("resolve", "t", "0", "--retry"), ("approve", "t", "0"),
    ("report", "t"), ("verify", "t"),
]  # fmt: skip
WHOLE_DATABASE = [("ls",), ("gc", "--older-than", "0s"), ("doctor",), ("verify", "--all"), ("ui",)]


@pytest.mark.parametrize("args", ONE_TASK + WHOLE_DATABASE, ids=" ".join)
def test_a_missing_database_is_one_rule_and_never_created(
    sqlite_lab: Lab, args: tuple[str, ...]
) -> None:
    line = one_line(sqlite_lab.cli(*args), 1 if args in ONE_TASK else 5)
    assert "no database at state.db" in line, line
    assert list(sqlite_lab.root.iterdir()) == []


@pytest.fixture
def sealed(tmp_path: Path) -> Iterator[Lab]:
    """A lab whose database (task ``t``, pending) lies on a tmpfs remounted read-only."""
    try:
        with small_disk(tmp_path / "ro", "8m") as disk:
            lab = Lab(tmp_path / "lab", db=str(disk / "state.db"))
            lab.guide_setup()
            assert lab.cli("create", "t", "plan.json").returncode == 0
            done = subprocess.run(
                ["mount", "-o", "remount,ro", str(disk)], capture_output=True, text=True,
                check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            yield lab
            shutil.rmtree(lab.root)
    except SmallDiskUnavailable as exc:
        pytest.fail(f"cannot mount a tmpfs for the read-only test: {exc}", pytrace=False)


@pytest.mark.linux
def test_a_read_only_file_system_is_named(sealed: Lab) -> None:
    disk = Path(sealed.db).parent
    before = sealed.files(disk)
    for args in (("run", "t"), ("create", "u", "plan.json"), ("cancel", "t")):
        line = one_line(sealed.cli(*args), 5)
        assert "read-only file system" in line, line
        assert "unable to open database file" not in line
    assert sealed.files(disk) == before
    # What the message promises: reading still works.
    assert sealed.cli("status", "t").json()["status"] == "pending"
    with pytest.raises(OSError, match="Read-only file system"):  # the control
        (disk / "probe").write_text("x")


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"", "plan file plan.json is empty"),
        (b"  \n", "plan file plan.json is empty"),
        (b'{"steps": [}', "plan file plan.json is not valid JSON: Expecting value"),
        (b'{"steps": NaN}', "plan file plan.json is not valid JSON: NaN is not allowed"),
        (b"\xff{}", "plan file plan.json is not valid JSON: not UTF-8 text"),
    ],
)
def test_a_plan_file_that_is_not_json_is_named(sqlite_lab: Lab, content: bytes, words: str) -> None:
    (sqlite_lab.root / "plan.json").write_bytes(content)
    line = one_line(sqlite_lab.cli("create", "t", "plan.json"), 4)
    assert words in line, line
    assert "line 1 column 1 (char 0)" not in line
    assert sorted(p.name for p in sqlite_lab.root.iterdir()) == ["plan.json"]


def test_create_warns_of_a_fetch_path_missing_here_and_still_stores(sqlite_lab: Lab) -> None:
    lab = sqlite_lab
    lab.guide_setup()
    (lab.root / "input" / "notes.txt").unlink()
    result = lab.cli("create", "t", "plan.json")
    assert result.returncode == 0, result  # the contract's create succeeds
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ninelives: warning: "), lines
    assert "input/notes.txt (step 0)" in lines[0]
    assert str(lab.root) in lines[0]
    assert lab.cli("status", "t").json()["status"] == "pending"
    # The control: with the file there, create says nothing on stderr.
    lab.write("input/notes.txt", "Line one\n")
    clean = lab.cli("create", "u", "plan.json")
    assert clean.returncode == 0
    assert clean.stderr == ""
    # Queued for workers, whose folder this one need not be: no warning.
    (lab.root / "input" / "notes.txt").unlink()
    queued = lab.cli("submit", "v", "plan.json")
    assert queued.returncode == 0
    assert queued.stderr == ""
