"""What ``--db`` (and ``NINELIVES_DB``) names: a SQLite path, a PostgreSQL URL or a
libpq keyword string, and PostgreSQL on an installation without its extra.

A keyword string (``host=... password=... dbname=...``) is PostgreSQL, never a
SQLite file named after it (with the password in its name, printed back).
Without psycopg every PostgreSQL form is one line naming the extra to
install and exit 5, never a ``ModuleNotFoundError`` traceback and exit 1.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ninelives
from errorlines import one_line
from ninelives.store import is_postgres_url
from ninelives.store.conninfo import redact_url
from ninelives.testing import Lab, Result
from ninelives.testing.lab import cli_command

SECRET = "s3cr3t-Pw"
#: A port nothing listens on: the connection is refused at once, offline.
CLOSED = "host=127.0.0.1 port=1 connect_timeout=2"


@pytest.mark.parametrize(
    ("text", "postgres"),
    [
        ("host=db dbname=x", True),
        (f"dbname = x password={SECRET}", True),
        ("  password=x", True),
        ("service=prod", True),
        (f"bogus=1 password={SECRET} host=h", True),  # libpq refuses it: never a file
        ("HOST=h", True),
        ("state.db", False),
        ("./host=x.db", False),  # the documented way to name such a file
        ("my=file.db", False),  # "=" alone does not make a connection string
        ("postgresql://h/x", True),
        ("sqlite:///tmp/x.db", False),
    ],
)
def test_which_texts_are_postgres(text: str, postgres: bool) -> None:
    from ninelives.store.conninfo import is_keyword_string

    assert is_postgres_url(text) is postgres
    assert is_keyword_string(text) is (postgres and "://" not in text)


@pytest.mark.parametrize(
    "given",
    [
        f"password={SECRET} host=h",
        f"host=h password='{SECRET}' dbname=x",
        f"host=h password = {SECRET}",
        f"host=h password={SECRET}&more dbname=x",  # "&" ends a URL's value, not a keyword's
        f"host=h password='open {SECRET}",  # a quote left open runs to the end
    ],
)
def test_a_keyword_strings_password_is_redacted(given: str) -> None:
    shown = redact_url(given)
    assert SECRET not in shown
    assert "***" in shown


def by_env(lab: Lab, given: str, *args: str) -> Result:
    """``ninelives ARGS`` in the lab with ``NINELIVES_DB`` set and no ``--db``."""
    done = subprocess.run(
        [*cli_command(), *args], cwd=lab.root, env=lab.env({"NINELIVES_DB": given}),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return Result(args=args, returncode=done.returncode, stdout=done.stdout, stderr=done.stderr)


def test_a_keyword_string_never_becomes_a_sqlite_file(sqlite_lab: Lab) -> None:
    lab = sqlite_lab
    lab.guide_setup()
    before = lab.files()
    given = f"{CLOSED} password={SECRET} dbname=x"
    for args in (("status", "demo"), ("create", "demo", "plan.json"), ("ls",), ("run", "demo")):
        for result in (Lab(lab.root, db=given).cli(*args), by_env(lab, given, *args)):
            line = one_line(result, 5)  # PostgreSQL asked for, and it cannot be reached
            assert "cannot connect" in line, line
            assert SECRET not in result.stdout + result.stderr
    assert lab.files() == before
    assert sorted(p.name for p in lab.root.iterdir()) == ["input", "plan.json"]


@pytest.mark.postgres
def test_a_keyword_string_opens_postgres(tmp_path: Path, pg_database: str) -> None:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from ninelives.store.conninfo import is_keyword_string

    keywords = make_conninfo(**conninfo_to_dict(pg_database))
    assert is_keyword_string(keywords), keywords
    lab = Lab(tmp_path / "lab", db=keywords)
    lab.guide_setup()
    assert lab.cli("create", "demo", "plan.json").returncode == 0
    assert lab.cli("run", "demo").returncode == 0
    # The same database through its URL: the keyword string did not go elsewhere.
    by_url = Lab(lab.root, db=pg_database)
    assert by_url.cli("status", "demo").json()["status"] == "done"
    assert sorted(p.name for p in lab.root.iterdir()) == ["artifacts", "input", "plan.json"]


# -- PostgreSQL without psycopg ----------------------------------------------------


@pytest.fixture(scope="module")
def without_psycopg(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """A command line for ``python -m ninelives`` that cannot import psycopg: this
    checkout's package copied alone onto ``PYTHONPATH``, site-packages off (``-S``).
    The copy keeps psycopg out even when ninelives is installed beside it."""
    root = tmp_path_factory.mktemp("nopg")
    shutil.copytree(
        Path(ninelives.__file__).parent,
        root / "ninelives",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    return [sys.executable, "-S", "-X", f"pycache_prefix={root / 'cache'}", str(root)]


def bare(prefix: list[str], cwd: Path, *args: str, **env: str) -> Result:
    *python, path = prefix
    environ = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": path, **env}
    done = subprocess.run(
        [*python, *args], cwd=cwd, env=environ, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    return Result(
        args=tuple(args), returncode=done.returncode, stdout=done.stdout, stderr=done.stderr
    )


def test_the_bare_interpreter_really_lacks_psycopg(
    without_psycopg: list[str], tmp_path: Path
) -> None:
    # The control: the process the next test runs cannot import psycopg, and can
    # import this checkout's ninelives.
    probe = "import importlib.util as u, ninelives as n; print(u.find_spec('psycopg'), n.__file__)"
    result = bare(without_psycopg, tmp_path, "-c", probe)
    assert result.returncode == 0, result
    spec, where = result.stdout.split()
    assert spec == "None"
    assert where.startswith(without_psycopg[-1])
    failed = bare(without_psycopg, tmp_path, "-c", "import psycopg")
    assert "ModuleNotFoundError" in failed.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("status", "demo"),
        ("create", "demo", "plan.json"),
        ("ls",),
        ("run", "demo"),
        ("export", "demo"),
        ("doctor",),
        ("worker", "--drain"),
    ],
)
@pytest.mark.parametrize(
    "given", ["postgresql://h/x", f"postgres://u:{SECRET}@h/x", f"host=h password={SECRET}"]
)
def test_postgres_without_its_extra_is_one_line_and_exit_5(
    without_psycopg: list[str], tmp_path: Path, args: tuple[str, ...], given: str
) -> None:
    (tmp_path / "plan.json").write_text(
        '{"steps": [{"tool": "fetch", "input": {"path": "notes.txt"}}]}', encoding="utf-8"
    )
    for result in (
        bare(without_psycopg, tmp_path, "-m", "ninelives", "--db", given, *args),
        bare(without_psycopg, tmp_path, "-m", "ninelives", *args, NINELIVES_DB=given),
    ):
        line = one_line(result, 5)
        assert "pip install 'ninelives[postgres]'" in line, line
        assert SECRET not in result.stdout + result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]
