"""Shared fixtures: a scratch :class:`~ninelives.testing.Lab` per test, per backend."""

from __future__ import annotations

import faulthandler
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ninelives.testing import Lab

if TYPE_CHECKING:
    from pgcluster import PgServer

BACKENDS = ["sqlite", "postgres"]
#: The third backend of tests marked ``fsync_on``: PostgreSQL with the server's
#: durable defaults (fsync, full_page_writes), not the session cluster's fsync=off.
FSYNC_ON = "postgres-fsync-on"

# Failing steps retry at once in the suite (the tests of the wait itself set it);
# every ninelives process a test starts inherits this.
os.environ.setdefault("NINELIVES_BACKOFF", "0")


#: No test takes near this long; one that does is hung. Rather than stall the run
#: to its time limit with nothing to show, it prints every thread's stack and ends
#: the run (exit 1), so a hang is red at once and says where it hung.
HUNG_AFTER_S = 1500  # above the longest timeout a test sets (1200 s)
_STDERR = 2


def pytest_configure(config: pytest.Config) -> None:
    # The run's own stderr, before capture takes fd 2 over for each test.
    global _STDERR
    _STDERR = os.dup(sys.__stderr__.fileno())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    faulthandler.dump_traceback_later(HUNG_AFTER_S, exit=True, file=_STDERR)
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture(
    params=[pytest.param(b, marks=pytest.mark.postgres) if b == "postgres" else b for b in BACKENDS]
)
def backend(request: pytest.FixtureRequest) -> str:
    """The storage backend a parametrised test runs against."""
    return str(request.param)


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked ``fsync_on`` that takes ``backend`` runs on a third one too:
    a cluster of its own with fsync on (started once, for those few tests)."""
    if "backend" in metafunc.fixturenames and metafunc.definition.get_closest_marker("fsync_on"):
        # As a mark, so that it replaces the fixture's own params.
        metafunc.definition.add_marker(
            pytest.mark.parametrize(
                "backend",
                [
                    "sqlite",
                    pytest.param("postgres", marks=pytest.mark.postgres),
                    pytest.param(FSYNC_ON, marks=pytest.mark.postgres),
                ],
                indirect=True,
            )
        )


@pytest.fixture
def db(backend: str, request: pytest.FixtureRequest) -> str:
    """A fresh, empty database for one test: a SQLite file name (relative to the lab
    folder) or a PostgreSQL URL."""
    if backend == "sqlite":
        return "state.db"
    if backend == FSYNC_ON:
        return str(request.getfixturevalue("pg_fsync_database"))
    return str(request.getfixturevalue("pg_database"))


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """The session's PostgreSQL server: ``NINELIVES_TEST_PG_URL``, else a throwaway
    cluster started here and stopped at the end. If none can run, every test that
    needs it fails (never skips)."""
    from pgcluster import PgUnavailable, start_server

    try:
        server = start_server()
    except PgUnavailable as exc:
        pytest.fail(f"PostgreSQL tests cannot run: {exc}", pytrace=False)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def pg_fsync_server() -> Iterator[PgServer]:
    """A second server for the few tests marked ``fsync_on``: the server's durable
    defaults (fsync=on, full_page_writes=on). Started on first use only."""
    from pgcluster import PgUnavailable, start_server

    try:
        server = start_server(durable=True)
    except PgUnavailable as exc:
        pytest.fail(f"PostgreSQL tests cannot run: {exc}", pytrace=False)
    if server.execute_scalar("SHOW fsync") != "on":
        server.stop()
        pytest.fail("the fsync_on tests need a server with fsync=on", pytrace=False)
    yield server
    server.stop()


@pytest.fixture
def pg_fsync_database(pg_fsync_server: PgServer) -> Iterator[str]:
    """A new, empty database on the fsync=on server, dropped afterwards."""
    name = pg_fsync_server.create_database()
    yield pg_fsync_server.url(name)
    pg_fsync_server.recycle(name)


@pytest.fixture
def pg_database(pg_server: PgServer) -> Iterator[str]:
    """The URL of a new, empty database on the session's server, dropped afterwards."""
    name = pg_server.create_database()
    yield pg_server.url(name)
    pg_server.recycle(name)


@pytest.fixture
def lab(tmp_path: Path, db: str) -> Iterator[Lab]:
    """A scratch folder running the installed CLI against ``db``, AGENT_* scrubbed."""
    lab = Lab(tmp_path / "lab", db=db)
    yield lab
    lab.reap()  # no runner a failed test started outlives it


@pytest.fixture
def sqlite_lab(tmp_path: Path) -> Iterator[Lab]:
    """A lab on the embedded SQLite default, for SQLite-only behaviour."""
    lab = Lab(tmp_path / "lab", db="state.db")
    yield lab
    lab.reap()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Off Linux, deselect the tests that need Linux itself (strace, tmpfs mounts,
    network namespaces) and say so at the end: they are not run, not passed."""
    if sys.platform.startswith("linux"):
        return
    linux_only = [item for item in items if item.get_closest_marker("linux")]
    if linux_only:
        items[:] = [item for item in items if not item.get_closest_marker("linux")]
        config.hook.pytest_deselected(items=linux_only)
        config.stash[_LINUX_ONLY] = len(linux_only)


_LINUX_ONLY = pytest.StashKey[int]()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    count = config.stash.get(_LINUX_ONLY, 0)
    if count:
        terminalreporter.write_line(
            f"ninelives: {count} Linux-only test(s) (I/O faults under strace, full disk, "
            f"network partition) were not run on {sys.platform}; run them on Linux",
            yellow=True,
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With NINELIVES_FORBID_SKIPS set (``make test``, CI), a skipped test fails the run:
    a test that could not run (say, for lack of a server) is not a passing one."""
    if not os.environ.get("NINELIVES_FORBID_SKIPS"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped:
        reporter.write_line(f"ninelives: {len(skipped)} test(s) skipped; skips are failures here")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
