"""A database password never reaches any output, in any form libpq accepts.

A password is planted in the URL as userinfo, as ``?password=``, unescaped
(``/``, ``?``, ``@`` in it), percent-encoded wrongly (psycopg's own error then
echoes it), and in ``NINELIVES_DB``; every command's stdout and stderr is
searched for every piece of it, against a working server, an unreachable
one, and a server that goes down under a polling worker.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from fleet import Fleet

from errorlines import one_line
from ninelives.store.conninfo import redact_url, secrets_of
from ninelives.testing import Lab, Result
from pgcluster import PgCluster, PgServer, free_port, running_cluster

pytestmark = [pytest.mark.postgres, pytest.mark.crash]

PIECES = ("Pl4nted", "Zq9Wk")
PASSWORD = "Pl4ntedZq9Wk"


def with_password(url: str, form: str) -> str:
    """``url`` (no password) with the planted password in ``form``."""
    parts = urlsplit(url)
    user, host = parts.username or "postgres", parts.netloc.split("@")[-1]
    return {
        "userinfo": f"postgresql://{user}:{PASSWORD}@{host}{parts.path}",
        "query": f"postgresql://{user}@{host}{parts.path}?password={PASSWORD}",
        "encoded": f"postgresql://{user}:Pl4nted%40Zq9Wk@{host}{parts.path}",
        "slash": f"postgresql://{user}:Pl4nted/Zq9Wk@{host}{parts.path}",
        "question": f"postgresql://{user}:Pl4nted?Zq9Wk@{host}{parts.path}",
        "at": f"postgresql://{user}:Pl4nted@Zq9Wk@{host}{parts.path}",
        "bad_escape": f"postgresql://{user}:Pl4nted%zzZq9Wk@{host}{parts.path}",
        "bad_param": f"postgresql://{user}@{host}{parts.path}?passw=1&password={PASSWORD}",
    }[form]


def leaks(results: list[Result]) -> list[str]:
    return [
        f"{r.args}: {piece}"
        for r in results
        for piece in PIECES
        if piece in r.stdout or piece in r.stderr
    ]


def every_command(lab: Lab, **env: str) -> list[Result]:
    lab.guide_setup()
    return [
        lab.cli("create", "t", "plan.json", **env),
        lab.cli("submit", "q", "plan.json", **env),
        lab.cli("status", "t", **env),
        lab.cli("status", "t", "--json", "--outputs", **env),
        lab.cli("run", "t", **env),
        lab.cli("export", "t", **env),
        lab.cli("verify", "--all", "--artifacts", "artifacts", **env),
        lab.cli("worker", "--drain", "--poll", "0.05", **env),
        lab.cli("create", "t", "plan.json", **env),  # exists: an error that names things
        lab.cli("status", "missing", **env),
    ]


@pytest.mark.parametrize("form", ["userinfo", "query", "encoded"])
def test_a_working_url_with_a_password_never_shows_it(
    tmp_path: Path, pg_database: str, form: str
) -> None:
    url = with_password(pg_database, form)
    results = every_command(Lab(tmp_path / "lab", db=url))
    assert leaks(results) == []
    # The control: the commands did work (the trust server accepts any password).
    assert [r.returncode for r in results] == [0, 0, 0, 0, 0, 0, 0, 0, 4, 1], results


def test_a_password_in_ninelives_db_never_shows(tmp_path: Path, pg_database: str) -> None:
    lab = Lab(tmp_path / "lab", db="state.db")
    lab.command = [*lab.command]
    url = with_password(pg_database, "query")
    lab.argv = lambda args: [*lab.command, *args]  # type: ignore[method-assign]
    results = every_command(lab, NINELIVES_DB=url)
    assert leaks(results) == []
    assert results[0].returncode == 0
    assert not (lab.root / "state.db").exists()


@pytest.mark.parametrize(
    "form", ["userinfo", "query", "slash", "question", "at", "bad_escape", "bad_param"]
)
def test_an_unusable_url_never_shows_its_password(tmp_path: Path, form: str) -> None:
    url = with_password(f"postgresql://someone@127.0.0.1:{free_port()}/nothing", form)
    lab = Lab(tmp_path / "lab", db=url)
    results = every_command(lab)
    assert leaks(results) == []
    for result in results:
        assert result.returncode == 5, result
        assert result.stderr.count("\n") == 1, result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize("scheme", ["postgresql+psycopg", "POSTGRESQL", "Postgres", "mysql"])
@pytest.mark.parametrize("how", ["--db", "NINELIVES_DB"])
def test_a_url_of_a_scheme_not_taken_is_refused_without_its_password(
    tmp_path: Path, scheme: str, how: str
) -> None:
    """A URL of a scheme ninelives does not take (SQLAlchemy's ``postgresql+psycopg``,
    as an application's DATABASE_URL holds it; a scheme in capitals, which libpq
    refuses; another database's) was read as a SQLite file name, and every
    command printed it, password and all ("database folder does not exist:
    postgresql+psycopg://someone:Pl4ntedZq9Wk@..."). It is refused, exit 5,
    naming the URLs taken, with its password masked; nothing is created."""
    url = f"{scheme}://someone:{PASSWORD}@127.0.0.1:{free_port()}/nothing"
    lab = Lab(tmp_path / "lab", db="state.db" if how == "NINELIVES_DB" else url)
    if how == "NINELIVES_DB":
        lab.argv = lambda args: [*lab.command, *args]  # type: ignore[method-assign]
    results = every_command(lab, NINELIVES_DB=url)
    assert leaks(results) == []
    for result in results:
        one_line(result, 5, "postgresql://", "sqlite:///")
    assert sorted(p.name for p in lab.root.iterdir()) == ["input", "plan.json"]


@pytest.mark.parametrize("scheme", ["postgresql", "postgresql+psycopg", "POSTGRESQL", "mysql"])
def test_a_url_given_where_a_task_id_goes_never_shows_its_password(
    tmp_path: Path, scheme: str
) -> None:
    """The last scrub before the terminal masks the password of any URL the command
    was given, whatever its scheme: a URL pasted where a task id goes is echoed
    in the error ("unknown task '...'") with its password masked."""
    lab = Lab(tmp_path / "lab", db="state.db")
    lab.guide_setup()
    url = f"{scheme}://someone:{PASSWORD}@db.example/nothing"
    results = [
        lab.cli("status", url),
        lab.cli("export", url),
        lab.cli("create", url, "plan.json"),
        lab.cli("--db", "state.db", "run", url),
    ]
    assert leaks(results) == []
    assert [r.returncode for r in results] == [1, 1, 4, 1], results
    assert all("someone:***@db.example" in r.stderr for r in results), results


def test_the_secrets_cover_every_piece() -> None:
    for form in ("userinfo", "query", "slash", "question", "at", "bad_escape", "bad_param"):
        url = with_password("postgresql://u@h:5432/db", form)
        shown = redact_url(url)
        assert not [p for p in PIECES if p in shown], (form, shown)
        assert secrets_of(url), form
    # The control: a URL without a password is shown as it is.
    assert redact_url("postgresql://u@h:5432/db?sslmode=require") == (
        "postgresql://u@h:5432/db?sslmode=require"
    )


# -- a worker polling a database that went down ---------------------------------------------


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[PgCluster]:
    with running_cluster() as cluster:
        yield cluster


def test_a_worker_never_logs_the_password_while_the_database_is_down(
    tmp_path: Path, own_cluster: PgServer
) -> None:
    assert isinstance(own_cluster, PgCluster)
    name = own_cluster.create_database()
    url = with_password(own_cluster.url(name), "query")
    lab = Lab(tmp_path / "lab", db=url)
    fleet = Fleet(lab)
    try:
        worker = fleet.start("--poll", "0.05")
        worker.wait_for("started")
        own_cluster.halt()
        try:
            deadline = time.monotonic() + 60
            while len(worker.actions("store_error")) < 3:
                assert time.monotonic() < deadline, worker.log()
                time.sleep(0.05)
        finally:
            own_cluster.resume()
        worker.signal(signal.SIGTERM)
        assert worker.wait(60) == 0, worker.log()
        log = worker.log()
        assert [p for p in PIECES if p in log] == [], log
        assert "password=***" in log  # the errors did name the database
    finally:
        fleet.close()
        own_cluster.drop_database(name)
