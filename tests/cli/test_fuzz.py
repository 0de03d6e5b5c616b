"""Fuzzing the command line: plan files, task ids, tool outputs and environment values.

Every input must end in exit 0 or a documented code with a one-line message
on stderr, never a traceback, and ``verify`` must stay clean afterwards.
Most examples call ``cli.main()`` in this process (a real SQLite file in a
fresh folder each); a few go through the installed command as a subprocess.
The examples are derandomized so that CI sees the same inputs every time.
"""

from __future__ import annotations

import json
import os
import string
import tempfile
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ninelives import cli
from ninelives.testing import Lab
from ninelives.testing.lab import GUIDE_PLAN, SUMMARY_NOTES

#: The exit codes fuzzed input may reach, each documented in docs/reference/exit-codes.md
#: (tests/cli/test_docs_reference.py checks that it is).
DOCUMENTED = {0, 1, 2, 3, 4, 5, 6, 7, 10, 130}
FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
TOOLS = ["fetch", "summarize", "write_artifact", "nope", ""]

# Text with everything a terminal or a parser might choke on.
NASTY = st.text(
    st.characters(codec="utf-8", exclude_categories=["Cs"])
    | st.sampled_from("\x1b\r\n\x9b\u202e/.%"),
    max_size=40,
)
JSON_SCALARS = st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False) | NASTY
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(NASTY, inner, max_size=4),
    max_leaves=12,
)
STEP = st.fixed_dictionaries(
    {"tool": st.sampled_from(TOOLS) | NASTY},
    optional={
        "input": st.fixed_dictionaries(
            {},
            optional={
                "path": st.sampled_from(["input/notes.txt", "../x", "/etc/passwd", ""]) | NASTY,
                "from": st.integers(-2, 4) | JSON_SCALARS,
            },
        )
        | JSON
    },
)
PLANS = (
    st.fixed_dictionaries(
        {"steps": st.lists(STEP, max_size=4)}, optional={"goal": NASTY | JSON_SCALARS}
    ).map(json.dumps)
    | JSON.map(json.dumps)
    | st.binary(max_size=80).map(lambda b: b.decode("latin-1"))
)
TASK_IDS = NASTY | st.text(string.ascii_letters + string.digits + "._-/", min_size=1, max_size=10)


@contextmanager
def scratch(monkeypatch: pytest.MonkeyPatch, env: dict[str, str] | None = None) -> Iterator[Path]:
    """A fresh folder as the working directory, with the guide's notes and only ``env``."""
    with tempfile.TemporaryDirectory() as tmp, monkeypatch.context() as patch:
        for name in list(os.environ):
            if name.startswith(("AGENT_", "NINELIVES_", "OLLAMA_")):
                patch.delenv(name)
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        patch.chdir(tmp)
        root = Path(tmp)
        (root / "input").mkdir()
        (root / "input" / "notes.txt").write_text(SUMMARY_NOTES, encoding="utf-8")
        yield root


def call(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``ninelives ARGS`` in this process: (exit code, stdout, stderr), checked."""
    capsys.readouterr()
    try:
        code = cli.main(list(args))
    except SystemExit as exc:  # only --help/--version exit this way
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert code in DOCUMENTED, (args, code, err)
    assert "Traceback" not in err, err
    if code != 0:
        assert err.splitlines()[-1].startswith("ninelives: error: "), err
        if args and args[0] != "run":  # run prints progress lines before its error
            assert err.count("\n") == 1, err
    return code, out, err


def verify_clean(capsys: Any) -> None:
    if not Path("state.db").exists():
        return
    code, out, _ = call(capsys, "verify", "--all", "--artifacts", "artifacts")
    assert code == 0, out


@FUZZ
@given(plan=PLANS)
def test_any_plan_file(plan: str, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    with scratch(monkeypatch) as root:
        (root / "plan.json").write_text(plan, encoding="utf-8", errors="surrogatepass")
        code, _, _ = call(capsys, "create", "t", "plan.json")
        assert code in (0, 4)
        if code == 0:
            assert call(capsys, "run", "t", "-q")[0] in (0, 2)
            assert call(capsys, "status", "t")[0] == 0
            assert call(capsys, "export", "t")[0] == 0
        else:
            assert call(capsys, "status", "t")[0] == 1  # nothing was stored
        verify_clean(capsys)


@FUZZ
@given(task_id=TASK_IDS)
def test_any_task_id(task_id: str, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    with scratch(monkeypatch) as root:
        (root / "plan.json").write_text(json.dumps(GUIDE_PLAN), encoding="utf-8")
        code, _, _ = call(capsys, "create", task_id, "plan.json")
        assert code in (0, 4)
        for command in ("status", "export", "run"):
            assert call(capsys, command, task_id)[0] in ((0,) if code == 0 else (1, 4))
        assert call(capsys, "verify", task_id)[0] in ((0,) if code == 0 else (1, 4, 5))
        verify_clean(capsys)
        # Ids are data: nothing appears outside the database's and artifacts' names.
        allowed = {"artifacts", "input", "plan.json", "state.db", "state.db.locks"}
        assert {p.name for p in root.iterdir()} <= allowed | {"state.db-wal", "state.db-shm"}


@FUZZ
@given(notes=NASTY | st.text(max_size=300))
def test_any_tool_output(notes: str, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    with scratch(monkeypatch) as root:
        (root / "input" / "notes.txt").write_text(notes, encoding="utf-8")
        (root / "plan.json").write_text(json.dumps(GUIDE_PLAN), encoding="utf-8")
        assert call(capsys, "create", "t", "plan.json")[0] == 0
        code, _, err = call(capsys, "run", "t")
        assert code in (0, 2)
        for line in err.splitlines():  # progress lines: escaped, one per line
            assert not set(line) & set("\x1b\r\x9b\u202e"), line
        _, shown, _ = call(capsys, "status", "t", "--outputs")
        assert not set(shown) & set("\x1b\x9b\u202e")
        verify_clean(capsys)


ENV_NAMES = [
    "AGENT_MAX_ATTEMPTS",
    "AGENT_STEP_DELAY",
    "AGENT_ARTIFACTS",
    "AGENT_UNSAFE_EFFECTS",
    "NINELIVES_LEASE",
    "NINELIVES_HEARTBEAT",
    "NINELIVES_QUEUE",
    "NINELIVES_WORKSPACE",
]
ENV_VALUES = (
    NASTY
    | st.sampled_from(["0", "-1", "nan", "inf", "1e999", "3", "0.01", "", "1", "x" * 300])
    | st.integers(-10, 10).map(str)
)


def harmless(env: dict[str, str]) -> dict[str, str]:
    """Drop values that would be accepted and do harm here: a long sleep, or a
    folder outside the scratch folder."""
    kept = {}
    for name, value in env.items():
        if "\0" in value:
            continue
        if name == "AGENT_STEP_DELAY":
            try:
                if float(value) > 0.05:
                    continue
            except ValueError:
                pass
        if name in ("AGENT_ARTIFACTS", "NINELIVES_WORKSPACE") and (
            value.startswith("/") or ".." in value
        ):
            continue
        kept[name] = value
    return kept


@FUZZ
@given(env=st.dictionaries(st.sampled_from(ENV_NAMES), ENV_VALUES, max_size=4).map(harmless))
@pytest.mark.slow
def test_any_environment(env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    with scratch(monkeypatch, env) as root:
        (root / "plan.json").write_text(json.dumps(GUIDE_PLAN), encoding="utf-8")
        code, _, _ = call(capsys, "create", "t", "plan.json")
        assert code in (0, 4)
        if code == 0:
            assert call(capsys, "run", "t", "-q")[0] in (0, 2, 4)
        for command in ("status", "export"):
            call(capsys, command, "t")
        if Path("state.db").exists():
            folder = env.get("AGENT_ARTIFACTS") or "artifacts"
            code, out, _ = call(capsys, "verify", "--all", "--artifacts", folder)
            assert code == 0, out


# -- through the installed command ------------------------------------------------------


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    plan=PLANS,
    task_id=TASK_IDS,
    crash=st.sampled_from(["", "bogus", "before_effect:x", "after_effect:99", "after_commit"]),
)
@pytest.mark.slow
def test_subprocess_inputs(plan: str, task_id: str, crash: str, tmp_path: Path) -> None:
    with tempfile.TemporaryDirectory(dir=tmp_path) as tmp:
        lab = Lab(Path(tmp), db="state.db")
        lab.write("input/notes.txt", SUMMARY_NOTES)
        lab.write("plan.json", plan)
        task_id = task_id.replace("\0", "?")  # argv cannot carry a NUL
        results = [lab.cli("create", task_id, "plan.json")]
        results.append(lab.cli("run", task_id, "-q", AGENT_CRASH_AT=crash))
        results += [lab.cli("status", task_id), lab.cli("export", task_id)]
        for result in results:
            # A valid crash point really kills the run: -9 is the point of it.
            assert result.returncode in DOCUMENTED | {-9}, result
            assert "Traceback" not in result.stderr, result
            if result.returncode not in (0, -9):
                assert result.stderr.count("\n") == 1, result
        verify = lab.cli("verify", "--all", "--artifacts", "artifacts")
        if (lab.root / "state.db").exists():
            if results[1].returncode == -9:  # resume the killed run, then verify
                assert lab.cli("run", task_id, "-q").returncode in (0, 2)
                verify = lab.cli("verify", "--all", "--artifacts", "artifacts")
            assert verify.returncode == 0, verify


# -- --db strings: paths, URLs, libpq keyword strings, odd bytes ------------------------

#: A password no output may ever hold, however the string around it is formed.
PASSWORD = "pw-Zq81xK"
#: Where every PostgreSQL form points: nothing listens there, so it is refused at once.
CLOSED = ("127.0.0.1", "1")
PW_AROUND = st.text(st.sampled_from("ab'\\ /?#@&:=%\"+"), max_size=4)
PASSWORDS = st.builds(lambda a, b: a + PASSWORD + b, PW_AROUND, PW_AROUND)


def _keywords(password: str, extra: list[tuple[str, str]], quoted: bool) -> str:
    shown = "'" + password.replace("\\", "\\\\").replace("'", "\\'") + "'" if quoted else password
    pairs = [*extra, ("password", shown), ("host", CLOSED[0]), ("port", CLOSED[1])]
    return " ".join(f"{k}={v}" for k, v in pairs)


KEYWORD_STRINGS = st.builds(
    _keywords,
    PASSWORDS,
    st.lists(
        st.tuples(
            st.sampled_from(["dbname", "user", "sslmode", "connect_timeout", "bogus", "HOST"]),
            st.text(st.sampled_from("xy1=' "), min_size=1, max_size=4),
        ),
        max_size=2,
    ),
    st.booleans(),
)
URLS = st.builds(
    lambda scheme, password, quote, query: (
        f"{scheme}://u:{password if not quote else urllib.parse.quote(password, safe='')}"
        f"@{CLOSED[0]}:{CLOSED[1]}/db{query}"
    ),
    st.sampled_from(["postgresql", "postgres", "postgresql+psycopg", "POSTGRESQL"]),
    PASSWORDS.filter(lambda p: not set(p) & set("/?#@")),  # raw: libpq would read a host in it
    st.booleans(),
    st.sampled_from(["", "?sslmode=disable", f"?password={PASSWORD}", "?connect_timeout=x"]),
) | PASSWORDS.map(lambda p: f"postgresql://u@{CLOSED[0]}:{CLOSED[1]}/db?password={p}")


def _relative(text: str) -> bool:
    # Nothing the fuzzer makes may name a place outside the scratch folder.
    return not text.startswith(("/", "sqlite:///", "~")) and ".." not in text


DB_PATHS = (
    st.sampled_from(
        [
            "state.db",
            "./host=x.db",
            "sub/state.db",
            "input",
            "input/notes.txt",
            "",
            ".",
            os.devnull,
            "sqlite://",
            "sqlite:x.db",
            "sqlite:///nonexistent-ninelives/x.db",
            "host=",
            "password",
            "my=file.db",
        ]
    )
    | NASTY.filter(_relative)
    | st.binary(min_size=1, max_size=12)
    .map(lambda b: b.replace(b"\0", b"").decode("utf-8", "surrogateescape"))
    .filter(_relative)
)
DB_STRINGS = DB_PATHS | KEYWORD_STRINGS | URLS


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@FUZZ
@given(db=DB_STRINGS, how=st.sampled_from(["--db", "--db=", "NINELIVES_DB"]))
def test_any_db_string(db: str, how: str, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    from ninelives.store import is_postgres_url

    # An environment cannot hold a NUL (nor argv: in this process it reaches the store).
    env = {"NINELIVES_DB": db} if how == "NINELIVES_DB" and db and "\0" not in db else {}
    given = [] if env else ([f"--db={db}"] if how == "--db=" else ["--db", db])
    with scratch(monkeypatch, env) as root:
        (root / "plan.json").write_text(json.dumps(GUIDE_PLAN), encoding="utf-8")
        for args in (("status", "t"), ("ls",), ("create", "t", "plan.json"), ("export", "t")):
            before = _listing(root)
            code, out, err = call(capsys, *given, *args)
            assert PASSWORD not in out + err, (db, out, err)
            if code != 0 or is_postgres_url(db):
                # Refused (or PostgreSQL, which nothing listens for here): no file made.
                assert _listing(root) == before, (db, args, code)
