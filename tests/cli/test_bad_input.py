"""Every bad input to the command: exit code, one-line error, nothing stored changes.

Each test starts from a seeded lab (task ``keep`` run to done with its artifact,
task ``todo`` created and pending), takes a fingerprint of the stored state,
feeds one bad input and checks the fingerprint is identical afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ninelives
from ninelives.errors import UnknownTask
from ninelives.models import TaskStatus
from ninelives.plan import MAX_DEPTH, MAX_PLAN_BYTES
from ninelives.runtime import Runtime, decisions
from ninelives.settings import Settings
from ninelives.testing import Lab, Result
from ninelives.testing.lab import GUIDE_PLAN

TASKS = ("keep", "todo")


def assert_one_line_error(result: Result, code: int) -> None:
    """The documented exit code and exactly one line on stderr, never a traceback."""
    assert result.returncode == code, result
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ninelives: error: "), result.stderr
    assert result.stdout == ""


def _seed(lab: Lab) -> None:
    lab.guide_setup()
    assert lab.cli("create", "keep", "plan.json").returncode == 0
    assert lab.cli("run", "keep").returncode == 0
    assert lab.cli("create", "todo", "plan.json").returncode == 0


@pytest.fixture(scope="module")
def sqlite_seed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seeded SQLite lab built once per module; tests get a copy."""
    lab = Lab(tmp_path_factory.mktemp("seed") / "lab")
    _seed(lab)
    return lab.root


@pytest.fixture
def seeded(lab: Lab, request: pytest.FixtureRequest) -> Lab:
    """The seeded lab on every backend."""
    if lab.sqlite_path == lab.root / "state.db":
        # A closed SQLite database is a plain file: copying it gives the same state.
        template = request.getfixturevalue("sqlite_seed")
        shutil.copytree(template, lab.root, symlinks=True, dirs_exist_ok=True)
    else:
        _seed(lab)
    return lab


@pytest.fixture
def sqlite_seeded(sqlite_lab: Lab, sqlite_seed: Path) -> Lab:
    """The seeded lab on SQLite, for the long lists of inputs that are refused
    before any database is opened (so the backend cannot matter)."""
    shutil.copytree(sqlite_seed, sqlite_lab.root, symlinks=True, dirs_exist_ok=True)
    return sqlite_lab


def _plan(**override: Any) -> bytes:
    return json.dumps({**GUIDE_PLAN, **override}).encode()


def _steps(*steps: dict[str, Any]) -> bytes:
    return json.dumps({"goal": "g", "steps": list(steps)}).encode()


FETCH = {"tool": "fetch", "input": {"path": "input/notes.txt"}}


def _from(ref: Any) -> bytes:
    return _steps(FETCH, {"tool": "summarize", "input": {"from": ref}}, FETCH)


def _nested(depth: int) -> bytes:
    inner = "1"
    for _ in range(depth):
        inner = '{"a": ' + inner + "}"
    head = '{"steps": [{"tool": "fetch", "input": {"path": "x", "deep": '
    return (head + inner + "}}]}").encode()


BAD_PLANS: dict[str, bytes | None] = {
    "missing file": None,
    "empty file": b"",
    "not JSON": b"this is not JSON",
    "truncated JSON": _plan()[:-3],
    "NaN": b'{"goal": "g", "steps": NaN}',
    "not UTF-8": b'{"goal": "\xff\xfe", "steps": []}',
    "lone surrogate": b'{"goal": "\\udc80", "steps": [{"tool": "fetch", "input": {"path": "x"}}]}',
    "NUL in the goal": _plan(goal="a\0b"),
    "NUL in an input key": _steps({"tool": "fetch", "input": {"path": "x", "k\0": 1}}),
    "a list": b"[]",
    "a string": b'"plan"',
    "steps not a list": _plan(steps={"0": FETCH}),
    "goal not a string": _plan(goal=["g"]),
    "no steps": _plan(steps=[]),
    "no steps key": b'{"goal": "g"}',
    "step not an object": _steps(FETCH, "summarize"),  # type: ignore[arg-type]
    "step without tool": _steps({"input": {"path": "x"}}),
    "empty tool name": _steps({"tool": "", "input": {}}),
    "tool not a string": _steps({"tool": ["fetch"], "input": {}}),
    "unknown tool": _steps(FETCH, {"tool": "delete_everything", "input": {"from": 0}}),
    "input not an object": _steps({"tool": "fetch", "input": "input/notes.txt"}),
    "from the same step": _from(1),
    "from a later step": _from(2),
    "from a missing step": _from(99),
    "from a negative step": _from(-1),
    "from a string": _from("0"),
    "from a float": _from(0.0),
    "from a bool": _from(True),
    "from null": _from(None),
    "from in step 0": _steps({"tool": "summarize", "input": {"from": 0}}),
    "summarize without from": _steps(FETCH, {"tool": "summarize", "input": {}}),
    "fetch without path": _steps({"tool": "fetch", "input": {}}),
    "fetch absolute path": _steps({"tool": "fetch", "input": {"path": "/etc/passwd"}}),
    "fetch parent path": _steps({"tool": "fetch", "input": {"path": "../outside.txt"}}),
    "fetch nested parent": _steps({"tool": "fetch", "input": {"path": "input/../../x"}}),
    "fetch path not a string": _steps({"tool": "fetch", "input": {"path": 7}}),
    "too large": _plan(goal="x" * MAX_PLAN_BYTES),
    "5000 nested lists": b"[" * 5000 + b"]" * 5000,
    "5000 nested objects": b'{"a":' * 5000 + b"1" + b"}" * 5000,
    "nested past the limit": _nested(MAX_DEPTH),
    # JSON parsers disagree on a repeated key (the last wins here): which plan was meant?
    "steps twice": b'{"steps": [], "steps": [{"tool": "fetch", "input": {"path": "x"}}]}',
    "tool twice": b'{"steps": [{"tool": "summarize", "tool": "fetch", "input": {"path": "x"}}]}',
    "input key twice": _steps(FETCH)[:-4] + b', "path": "input/notes.txt"}}]}',
}


@pytest.mark.parametrize("case", list(BAD_PLANS))
def test_bad_plan_is_refused_and_changes_nothing(sqlite_seeded: Lab, case: str) -> None:
    content = BAD_PLANS[case]
    if content is not None:
        (sqlite_seeded.root / "bad.json").write_bytes(content)
    before = sqlite_seeded.fingerprint(*TASKS)
    result = sqlite_seeded.cli("create", "new", "bad.json")
    assert_one_line_error(result, 4)
    assert sqlite_seeded.fingerprint(*TASKS) == before
    assert sqlite_seeded.cli("status", "new").returncode == 1  # no half-created task


def test_plan_that_is_a_folder_is_refused(sqlite_seeded: Lab) -> None:
    (sqlite_seeded.root / "plans").mkdir()
    before = sqlite_seeded.fingerprint(*TASKS)
    assert_one_line_error(sqlite_seeded.cli("create", "new", "plans"), 4)
    assert sqlite_seeded.fingerprint(*TASKS) == before


def test_the_controls_of_the_bad_plans_are_accepted(lab: Lab) -> None:
    # The same shapes one edit away from the bad ones are fine: the refusals
    # above come from the defect, not from the way the files are written.
    good = {
        "from an earlier step": _from(0),
        "nested up to the limit": _nested(MAX_DEPTH - 5),
        "unicode goal": _plan(goal="Résumé ✓ \t tab, \u00e9, \U0001f600"),
    }
    lab.guide_setup()
    ids = [f"good{n}" for n in range(len(good))]
    before = lab.fingerprint(*ids)
    for task_id, (case, content) in zip(ids, good.items(), strict=True):
        (lab.root / f"{task_id}.json").write_bytes(content)
        result = lab.cli("create", task_id, f"{task_id}.json")
        assert result.returncode == 0, (case, result)
    # And the fingerprint does see a change when something is stored.
    assert lab.fingerprint(*ids) != before


def test_existing_task_id_is_refused_and_the_original_untouched(seeded: Lab) -> None:
    seeded.write_plan({"goal": "other", "steps": [FETCH]}, "other.json")
    before = seeded.fingerprint(*TASKS)
    snapshot = seeded.snapshot("keep")
    for task_id in TASKS:
        assert_one_line_error(seeded.cli("create", task_id, "other.json"), 4)
    assert seeded.fingerprint(*TASKS) == before
    assert seeded.snapshot("keep") == snapshot  # status, outputs and journal, on any backend


PATHLIKE_IDS = ["../x", "a/b", "..", ".", "", ".hidden", "a\\b", "a b", "x" * 129, "x" * 5000]


@pytest.mark.parametrize("task_id", PATHLIKE_IDS)
def test_task_id_that_could_name_a_path_is_refused(
    sqlite_seeded: Lab, tmp_path: Path, task_id: str
) -> None:
    everything = sqlite_seeded.files(tmp_path)
    before = sqlite_seeded.fingerprint(*TASKS)
    assert_one_line_error(sqlite_seeded.cli("create", task_id, "plan.json"), 4)
    assert sqlite_seeded.files(tmp_path) == everything  # nothing created anywhere around the lab
    assert sqlite_seeded.fingerprint(*TASKS) == before


def test_absolute_task_id_is_refused(sqlite_seeded: Lab, tmp_path: Path) -> None:
    task_id = str(tmp_path / "abs")
    everything = sqlite_seeded.files(tmp_path)
    assert_one_line_error(sqlite_seeded.cli("create", task_id, "plan.json"), 4)
    assert sqlite_seeded.files(tmp_path) == everything


@pytest.mark.parametrize(
    "args", [("create", "-x", "plan.json"), ("create", "--", "-x", "plan.json")]
)
def test_option_like_task_id_is_refused(sqlite_seeded: Lab, args: tuple[str, ...]) -> None:
    before = sqlite_seeded.fingerprint(*TASKS)
    assert_one_line_error(sqlite_seeded.cli(*args), 4)
    assert sqlite_seeded.fingerprint(*TASKS) == before


BAD_ENV = [
    {"AGENT_MAX_ATTEMPTS": "abc"},
    {"AGENT_MAX_ATTEMPTS": "0"},
    {"AGENT_MAX_ATTEMPTS": "-2"},
    {"AGENT_STEP_DELAY": "soon"},
    {"AGENT_STEP_DELAY": "-1"},
    {"AGENT_STEP_DELAY": "nan"},
    {"AGENT_STEP_DELAY": "inf"},
    {"AGENT_CRASH_AT": "bogus"},
    {"AGENT_CRASH_AT": "before_effect:one"},
    # What int() and float() take but no one writes as a number: refused, not
    # read as 30 attempts, a 10 s delay or step 3.
    {"AGENT_MAX_ATTEMPTS": "3_0"},
    {"AGENT_MAX_ATTEMPTS": "\u0663"},  # ARABIC-INDIC DIGIT THREE
    {"AGENT_MAX_ATTEMPTS": "3 "},
    {"AGENT_STEP_DELAY": "1_0"},
    {"NINELIVES_BACKOFF": "\uff11"},  # FULLWIDTH DIGIT ONE
    {"AGENT_CRASH_AT": "before_effect:\u0663"},
    {"AGENT_CRASH_AT": "before_effect:\u00b2"},  # SUPERSCRIPT TWO
]


@pytest.mark.parametrize("env", BAD_ENV, ids=lambda env: "=".join(next(iter(env.items()))))
def test_bad_environment_value_is_refused_before_anything_runs(
    sqlite_seeded: Lab, env: dict[str, str]
) -> None:
    before = sqlite_seeded.fingerprint(*TASKS)
    assert_one_line_error(sqlite_seeded.cli("run", "todo", **env), 4)
    assert_one_line_error(sqlite_seeded.cli("create", "new", "plan.json", **env), 4)
    assert sqlite_seeded.fingerprint(*TASKS) == before
    assert sqlite_seeded.snapshot("todo").status["status"] == "pending"


USAGE_ERRORS = [
    (),
    ("bogus",),
    ("create",),
    ("create", "only-id"),
    ("create", "a", "--args", "[]"),
    ("create", "a", "plan.json", "--workflow", "w"),
    ("create", "a", "plan.json", "extra"),
    ("run",),
    ("run", "a", "b"),
    ("status",),
    ("export",),
    ("--nope", "status", "keep"),
    ("status", "keep", "--bogus"),
    ("run", "keep", "--quiet=yes"),
    # An empty --db ("$UNSET") names no database; it is not the working directory.
    ("--db", "", "status", "keep"),
    ("--db=", "create", "new", "plan.json"),
    ("status", "keep", "--db", ""),
]


@pytest.mark.parametrize("args", USAGE_ERRORS, ids=lambda a: " ".join(a) or "(none)")
def test_usage_error_is_one_line_and_exit_4(sqlite_seeded: Lab, args: tuple[str, ...]) -> None:
    before = sqlite_seeded.fingerprint(*TASKS)
    result = sqlite_seeded.cli(*args)
    assert_one_line_error(result, 4)
    assert "--help" in result.stderr
    assert sqlite_seeded.fingerprint(*TASKS) == before


def test_unknown_task_exits_1_and_changes_nothing(seeded: Lab) -> None:
    before = seeded.fingerprint(*TASKS)
    for command in ("run", "status", "export"):
        assert_one_line_error(seeded.cli(command, "ghost"), 1)
    assert seeded.fingerprint(*TASKS) == before


def test_every_kind_of_bad_input_on_every_backend(seeded: Lab) -> None:
    # One of each kind against each backend; the exhaustive lists above run on
    # SQLite, since they are refused before any database is opened.
    before = seeded.fingerprint(*TASKS)
    for name in ("unknown tool", "from a later step", "NUL in the goal", "lone surrogate"):
        (seeded.root / f"{name}.json").write_bytes(BAD_PLANS[name] or b"")
        assert_one_line_error(seeded.cli("create", "new", f"{name}.json"), 4)
    for name in ("unknown tool", "from a later step", "NUL in the goal", "lone surrogate"):
        (seeded.root / f"{name}.json").unlink()
    assert_one_line_error(seeded.cli("create", "../new", "plan.json"), 4)
    assert_one_line_error(seeded.cli("run", "todo", AGENT_MAX_ATTEMPTS="abc"), 4)
    assert_one_line_error(seeded.cli("run", "todo", AGENT_CRASH_AT="bogus"), 4)
    assert_one_line_error(seeded.cli("run"), 4)
    assert seeded.fingerprint(*TASKS) == before
    assert seeded.snapshot("todo").status["status"] == "pending"


def test_failed_bad_create_in_an_empty_folder_leaves_no_file(sqlite_lab: Lab) -> None:
    # No database existed: a refused create must not leave a new one behind.
    lab = sqlite_lab
    lab.write("good.json", json.dumps(GUIDE_PLAN))
    lab.write("bad.json", '{"steps": [{"tool": "nope"}]}')
    files = lab.files()
    assert_one_line_error(lab.cli("create", "t", "bad.json"), 4)
    assert_one_line_error(lab.cli("create", "t", "missing.json"), 4)
    assert_one_line_error(lab.cli("create", "../t", "good.json"), 4)
    assert_one_line_error(lab.cli("create", "t", "good.json", AGENT_MAX_ATTEMPTS="x"), 4)
    assert_one_line_error(lab.cli("create", "t", "good.json", "--queue", "../q"), 4)
    assert_one_line_error(lab.cli("submit", "t", "good.json", "--queue", ""), 4)
    assert lab.files() == files
    # The control: the same folder accepts a good create, which makes the database.
    assert lab.cli("create", "t", "good.json").returncode == 0
    assert "state.db" in lab.files()


@pytest.mark.parametrize("command", ["run", "status", "export"])
def test_unknown_task_without_a_database_creates_none(sqlite_lab: Lab, command: str) -> None:
    assert_one_line_error(sqlite_lab.cli(command, "ghost"), 1)
    assert sqlite_lab.files() == {}


#: The commands about one stored task, each with what follows its TASK argument.
LOOKUPS = {
    "status": (),
    "export": (),
    "run": (),
    "retry": (),
    "cancel": (),
    "verify": (),
    "replay-check": (),
    "fork": ("new", "--from", "1"),
    "resolve": ("1", "--retry"),
    "approve": ("1",),
}


@pytest.mark.parametrize("command", list(LOOKUPS))
def test_a_task_id_that_is_not_utf8_is_an_unknown_task(sqlite_seeded: Lab, command: str) -> None:
    # A shell passes any bytes; Python hands b"keep\xff" over as "keep\udcff",
    # which no stored id can be (create refuses it): unknown, exit 1, not a traceback.
    before = sqlite_seeded.fingerprint(*TASKS)
    result = sqlite_seeded.cli(command, os.fsdecode(b"keep\xff"), *LOOKUPS[command])
    assert_one_line_error(result, 1)
    assert "unknown task 'keep\\udcff'" in result.stderr
    assert sqlite_seeded.fingerprint(*TASKS) == before
    # The control: the same command reaches the task by its real id.
    assert sqlite_seeded.cli("status", "keep").returncode == 0


#: Each call of the library that names a stored task, given ``rt`` and the id.
LIBRARY_LOOKUPS: dict[str, Callable[[Runtime, str], object]] = {
    "status": lambda rt, task: rt.status(task),
    "export": lambda rt, task: rt.export(task),
    "result": lambda rt, task: rt.result(task),
    "run": lambda rt, task: rt.run(task),
    "retry": lambda rt, task: rt.retry(task),
    "cancel": lambda rt, task: rt.cancel(task, reason="r"),
    "fork": lambda rt, task: rt.fork(task, "new", start=1),
    "resolve": lambda rt, task: decisions.resolve(rt.store, task, 1, retry=True),
    "approve": lambda rt, task: decisions.approve(rt.store, task, 1),
}


@pytest.mark.parametrize("call", list(LIBRARY_LOOKUPS))
def test_the_library_takes_a_task_id_that_is_not_utf8_as_an_unknown_task(
    sqlite_seeded: Lab, call: str
) -> None:
    # The command refuses such an id before it opens anything; a program calling
    # the library with an id decoded the same way gets the same answer, not the
    # UnicodeEncodeError of a driver that cannot encode it.
    before = sqlite_seeded.fingerprint(*TASKS)
    with ninelives.open(str(sqlite_seeded.root / "state.db"), settings=Settings()) as rt:
        with pytest.raises(UnknownTask, match=r"unknown task 'keep\\udcff'"):
            LIBRARY_LOOKUPS[call](rt, os.fsdecode(b"keep\xff"))
        assert rt.status("keep").status is TaskStatus.DONE  # the control
    assert sqlite_seeded.fingerprint(*TASKS) == before


def test_create_of_a_task_id_that_is_not_utf8_is_bad_input(sqlite_seeded: Lab) -> None:
    before = sqlite_seeded.fingerprint(*TASKS)
    result = sqlite_seeded.cli("create", os.fsdecode(b"new\xff"), "plan.json")
    assert_one_line_error(result, 4)
    assert "invalid task id 'new\\udcff'" in result.stderr
    assert sqlite_seeded.fingerprint(*TASKS) == before


def test_a_plan_with_a_repeated_key_names_it(sqlite_seeded: Lab) -> None:
    # The first steps list would be dropped without a word, the task created
    # with the second: refused instead, naming the key.
    first = [FETCH, {"tool": "summarize", "input": {"from": 0}}]
    text = '{"goal": "g", "steps": ' + json.dumps(first) + ', "steps": [' + json.dumps(FETCH) + "]}"
    (sqlite_seeded.root / "twice.json").write_text(text)
    before = sqlite_seeded.fingerprint(*TASKS)
    result = sqlite_seeded.cli("create", "new", "twice.json")
    assert_one_line_error(result, 4)
    assert "duplicate key 'steps'" in result.stderr
    assert sqlite_seeded.fingerprint(*TASKS) == before
    # The control: the same plan with its key once is created.
    (sqlite_seeded.root / "once.json").write_text(json.dumps({"goal": "g", "steps": first}))
    assert sqlite_seeded.cli("create", "new", "once.json").returncode == 0
