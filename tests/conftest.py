"""Shared fixtures: a scratch :class:`~ninelives.testing.Lab` per test, per backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from ninelives.testing import Lab

BACKENDS = ["sqlite"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The storage backend a parametrised test runs against."""
    return str(request.param)


@pytest.fixture
def db(backend: str, request: pytest.FixtureRequest) -> str:
    """A fresh, empty database for one test: a SQLite file name (relative to the lab
    folder) or a PostgreSQL URL."""
    if backend == "sqlite":
        return "state.db"
    return str(request.getfixturevalue("pg_database"))


@pytest.fixture
def lab(tmp_path: Path, db: str) -> Lab:
    """A scratch folder running the installed CLI against ``db``, AGENT_* scrubbed."""
    return Lab(tmp_path / "lab", db=db)


@pytest.fixture
def sqlite_lab(tmp_path: Path) -> Lab:
    """A lab on the embedded SQLite default, for SQLite-only behaviour."""
    return Lab(tmp_path / "lab", db="state.db")
