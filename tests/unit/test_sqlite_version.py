"""The SQLite library must have RETURNING (3.35+): checked at open, exit 5."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from ninelives import cli
from ninelives.errors import StoreError
from ninelives.store import open_store
from ninelives.store.sqlite.files import MIN_SQLITE, check_sqlite_version


@pytest.mark.parametrize("version", [(3, 34, 1), (3, 8, 0), (2, 99, 99)])
def test_a_library_without_returning_is_refused(version: tuple[int, int, int]) -> None:
    text = ".".join(map(str, version))
    with pytest.raises(StoreError, match=rf"version {text}; ninelives needs 3\.35 or newer"):
        check_sqlite_version(version, text)


@pytest.mark.parametrize("version", [MIN_SQLITE, (3, 35, 5), (3, 45, 0), (4, 0, 0)])
def test_a_library_with_returning_is_accepted(version: tuple[int, int, int]) -> None:
    check_sqlite_version(version, ".".join(map(str, version)))  # the control: no error


def test_the_store_checks_the_library_it_runs_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The input of the check is faked (the version the sqlite3 module reports),
    # not the storage: the real file is then left uncreated.
    (tmp_path / "plan.json").write_text(
        '{"goal": "g", "steps": [{"tool": "fetch", "input": {"path": "notes.txt"}}]}'
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 34, 1))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.34.1")
    with pytest.raises(StoreError, match=r"3\.34\.1"):
        open_store(str(tmp_path / "state.db"))
    assert not (tmp_path / "state.db").exists()
    code = cli.main(["--db", str(tmp_path / "other.db"), "status", "t"])
    assert code == 1  # reading needs no RETURNING: a missing database is "unknown task"
    code = cli.main(["--db", str(tmp_path / "state.db"), "create", "t", "plan.json"])
    err = capsys.readouterr().err.splitlines()
    assert code == 5
    assert err[-1].startswith("ninelives: error: the SQLite library is version 3.34.1")
    assert not (tmp_path / "state.db").exists()
