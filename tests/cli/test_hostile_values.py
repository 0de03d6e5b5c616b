"""Values no check expected, on the command line and in stored rows.

Each case ran into a Python traceback (or a worse outcome) before: a duration
or port too large for a float or a socket, ``report -o`` naming the database
itself, a stored NaN copied by ``fork``, text that is not UTF-8, a time out of
any date's range, a BLOB in a text column. Each is now one line on stderr and
a documented exit code, nothing stored changes, and a task whose rows cannot
be read is that one task damaged (exit 5) while the others go on.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from pathlib import Path

import pytest

from errorlines import one_line
from ninelives.testing import Lab

APPROVAL = {"tool": "approval", "input": {"prompt": "ok?"}}


def sql(lab: Lab, statement: str) -> None:
    conn = sqlite3.connect(lab.root / "state.db")
    try:
        conn.execute(statement)
        conn.commit()
    finally:
        conn.close()


def task_ids(lab: Lab) -> list[str]:
    conn = sqlite3.connect(lab.root / "state.db")
    try:
        return sorted(row[0] for row in conn.execute("SELECT id FROM tasks"))
    finally:
        conn.close()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def two(sqlite_lab: Lab) -> Lab:
    """Tasks ``t`` (to be damaged) and ``u`` (its neighbour), each waiting for approval."""
    sqlite_lab.write_plan({"goal": "g", "steps": [APPROVAL]})
    for task in ("t", "u"):
        assert sqlite_lab.cli("create", task, "plan.json").returncode == 0
        assert sqlite_lab.cli("run", task, "-q").returncode == 8
    return sqlite_lab


# -- numbers on the command line ------------------------------------------------


@pytest.mark.parametrize("duration", ["9" * 400 + "s", "9" * 5000 + "s", "9" * 13 + "w", "365001d"])
def test_a_duration_too_long_is_exit_4(two: Lab, duration: str) -> None:
    before = digest(two.root / "state.db")
    one_line(two.cli("gc", "--older-than", duration), 4, "is too long")
    assert digest(two.root / "state.db") == before
    # control: the longest accepted, and a number with leading zeros
    assert two.cli("gc", "--older-than", "365000d", "--dry-run").returncode == 0
    assert two.cli("gc", "--older-than", "0" * 50 + "1s", "--dry-run").returncode == 0


@pytest.mark.parametrize("duration", ["\u0661s", "\uff13\uff10d", "1h\u0663m"])
def test_a_duration_in_another_scripts_digits_is_exit_4(two: Lab, duration: str) -> None:
    # As a number variable written so is refused: "\u0661s" was read as 1s, and
    # gc removed every finished task older than a second.
    assert two.cli("cancel", "t").returncode == 0
    time.sleep(1.1)  # t is finished and older than any of these durations read as digits
    before = digest(two.root / "state.db")
    one_line(two.cli("gc", "--older-than", duration), 4, "is not a number")
    assert digest(two.root / "state.db") == before
    assert task_ids(two) == ["t", "u"]


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (("fork", "t", "f", "--from", "\u0660"), "invalid integer value: '\u0660'"),
        (("fork", "t", "f", "--from", "0_0"), "invalid integer value: '0_0'"),
        (("approve", "t", " 0"), "invalid integer value: ' 0'"),
        (("ls", "--limit", "\uff11"), "invalid integer value: '\uff11'"),
        (("worker", "--drain", "--poll", "1_0"), "invalid number value: '1_0'"),
    ],
)
def test_a_number_option_takes_the_variables_number_rule(
    two: Lab, args: tuple[str, ...], shown: str
) -> None:
    # int() and float() read other scripts' digits, "_" and padding as numbers:
    # "fork --from \u0660" forked from step 0 and "approve t ' 0'" approved.
    before = digest(two.root / "state.db")
    one_line(two.cli(*args), 4, shown)
    assert digest(two.root / "state.db") == before
    assert task_ids(two) == ["t", "u"]


@pytest.mark.parametrize("port", ["70000", "9" * 400, "-1"])
def test_a_port_out_of_range_is_exit_4(two: Lab, port: str) -> None:
    one_line(two.cli("ui", "--port", port, timeout=30), 4, "--port must be 0-65535")


@pytest.mark.parametrize(
    ("option", "value"), [("--workers", "9" * 400), ("--workers", "257"), ("--kills", "9" * 400)]
)
def test_torture_numbers_out_of_range_are_exit_4(two: Lab, option: str, value: str) -> None:
    result = two.cli("torture", "plan.json", option, value, "--kills", "1", timeout=60)
    if option == "--kills":
        result = two.cli("torture", "plan.json", option, value, timeout=60)
    one_line(result, 4, f"{option} must be")


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (("--lease", "nan"), {}, "--lease must be 0.05-86400 seconds"),
        (("--heartbeat", "-1"), {}, "--heartbeat must be 0.05-86400 seconds"),
        ((), {"NINELIVES_LEASE": "0"}, "NINELIVES_LEASE must be at least 0.05"),
        ((), {"NINELIVES_HEARTBEAT": "1e9"}, "NINELIVES_HEARTBEAT must be at most 86400"),
    ],
)
def test_a_lease_out_of_range_names_what_gave_it(
    two: Lab, args: tuple[str, ...], env: dict[str, str], named: str
) -> None:
    # Not "ninelives_lease", which is neither the option nor the variable.
    before = digest(two.root / "state.db")
    one_line(two.cli("worker", "--drain", *args, **env), 4, named)
    assert digest(two.root / "state.db") == before


WORKER_NUMBERS = ("NINELIVES_LEASE", "NINELIVES_HEARTBEAT", "NINELIVES_GROUP_COMMIT_LINGER_MS")


@pytest.mark.parametrize("name", WORKER_NUMBERS)
@pytest.mark.parametrize(
    "value", ["nan", "inf", "-inf", "-1", "1_0", " 5", "5 ", "\uff15", "\u0665"]
)
def test_a_worker_variable_that_is_not_a_plain_number_is_exit_4(
    two: Lab, name: str, value: str
) -> None:
    # float() takes all of these ("1_0" is 10, a fullwidth 5 is 5); the worker's
    # variables are read by the rule every other number variable follows.
    before = digest(two.root / "state.db")
    one_line(two.cli("worker", "--drain", **{name: value}), 4, name)
    assert digest(two.root / "state.db") == before


def test_the_worker_variables_take_plain_numbers(two: Lab) -> None:
    env = {
        "NINELIVES_LEASE": "30",
        "NINELIVES_HEARTBEAT": "2.5",
        "NINELIVES_GROUP_COMMIT_LINGER_MS": "2.5",
    }
    assert two.cli("worker", "--drain", **env).returncode == 0


# -- report -o the database -----------------------------------------------------


@pytest.mark.parametrize(
    "target",
    ["state.db", "link.db", "../lab/state.db", "sub/../state.db", "state.db-wal",
     "state.db-shm", "state.db-journal", "state.db.blobs/x", "state.db.locks/x",
     "{root}/state.db"],
)  # fmt: skip
def test_report_never_overwrites_the_database(two: Lab, target: str) -> None:
    (two.root / "link.db").symlink_to("state.db")
    (two.root / "sub").mkdir()
    target = target.format(root=two.root)
    before = digest(two.root / "state.db")
    one_line(two.cli("report", "t", "-o", target), 4, "is the database", "nothing written")
    assert digest(two.root / "state.db") == before
    assert not (two.root / "state.db.blobs" / "x").exists()
    assert two.cli("status", "u").returncode == 0
    # control: another file is written
    assert two.cli("report", "t", "-o", "r.html").returncode == 0
    assert (two.root / "r.html").read_text().startswith("<!")


def test_report_through_a_symlinked_database_refuses_its_real_file(two: Lab) -> None:
    (two.root / "link.db").symlink_to("state.db")
    before = digest(two.root / "state.db")
    result = two.cli("--db", "link.db", "report", "t", "-o", "state.db-wal")
    one_line(result, 4, "is the database")
    assert digest(two.root / "state.db") == before


# -- fork of a stored NaN ---------------------------------------------------------


def test_fork_of_an_output_holding_nan_is_damaged_and_stores_nothing(sqlite_lab: Lab) -> None:
    sqlite_lab.write_plan({"goal": "g", "steps": [APPROVAL, APPROVAL]})
    assert sqlite_lab.cli("create", "t", "plan.json").returncode == 0
    assert sqlite_lab.cli("run", "t", "-q").returncode == 8
    assert sqlite_lab.cli("approve", "t", "0").returncode == 0
    assert sqlite_lab.cli("run", "t", "-q").returncode == 8
    # control: the fork works before the output is damaged
    assert sqlite_lab.cli("fork", "t", "ok", "--from", "1").returncode == 0
    sql(sqlite_lab, "UPDATE steps SET output = '{\"approved\": true, \"note\": NaN}' "
                    "WHERE task_id = 't' AND idx = 0")  # fmt: skip
    one_line(sqlite_lab.cli("fork", "t", "t2", "--from", "1"), 5, "task 't' is damaged", "step 0")
    assert task_ids(sqlite_lab) == ["ok", "t"]


# -- stored rows no reader expected -------------------------------------------------


def test_text_that_is_not_utf8_is_a_damaged_task_and_drain_ends(two: Lab) -> None:
    sql(two, "UPDATE tasks SET goal = CAST(X'FF41' AS TEXT) WHERE id = 't'")
    sql(two, "UPDATE tasks SET queue = 'default'")  # both where a worker looks
    sql(two, "UPDATE tasks SET status = 'pending' WHERE id = 't'")
    drain = two.cli("worker", "--drain", "--poll", "0.05", timeout=60)
    assert drain.returncode == 11, drain
    assert "Traceback" not in drain.stderr
    last = drain.stderr.splitlines()[-1]
    assert last.startswith("ninelives: error: queue 'default' drained except 1 task(s)"), last
    assert "task 't' is damaged" in last
    commands: list[tuple[str, ...]] = [
        ("status", "t"), ("run", "t"), ("export", "t"), ("cancel", "t"),
        ("fork", "t", "t2", "--from", "0"), ("report", "t", "-o", "r.html"),
    ]  # fmt: skip
    for command in commands:
        one_line(two.cli(*command), 5, "task 't' is damaged", "not UTF-8")
    listed = two.cli("ls", "--json")
    assert listed.returncode == 0, listed
    assert {r["task"]: r["status"] for r in listed.jsonl()} == {"t": "damaged", "u": "waiting"}
    # Listed as damaged, so asked for as such: no row stores it; verify names them.
    one_line(two.cli("ls", "--status", "waiting,damaged"), 4, "'ninelives verify --all' names")
    verify = two.cli("verify", "--all")
    assert verify.returncode == 7, verify
    assert "Traceback" not in verify.stderr, verify
    assert verify.stdout.startswith("t: damaged: task 't' is damaged"), verify
    assert two.cli("status", "u").returncode == 0
    assert task_ids(two) == ["t", "u"]


def test_a_task_id_that_is_not_utf8_stops_neither_the_queue_nor_ls(sqlite_lab: Lab) -> None:
    # An id no one can name, first in its queue: it blocked every worker (each
    # poll a store error) and made ls fail; now it is one damaged task.
    sqlite_lab.write_plan({"goal": "g", "steps": [{"tool": "write_artifact",
                           "input": {"name": "x.txt", "text": "hi"}}]})  # fmt: skip
    for task in ("bad", "ok"):
        assert sqlite_lab.cli("submit", task, "plan.json").returncode == 0
    for table, column in (("tasks", "id"), ("steps", "task_id"), ("events", "task_id")):
        sql(sqlite_lab, f"UPDATE {table} SET {column} = CAST(X'62FF64' AS TEXT) "
            f"WHERE {column} = 'bad'")  # fmt: skip
    drain = sqlite_lab.cli("worker", "--drain", "--poll", "0.05", timeout=60)
    assert drain.returncode == 11, drain
    assert "Traceback" not in drain.stderr
    assert "action=damaged task=b\\xffd" in drain.stderr
    last = drain.stderr.splitlines()[-1]
    assert "drained except 1 task(s)" in last, last
    assert "its id is not UTF-8" in last, last
    assert sqlite_lab.cli("status", "ok").json()["status"] == "done"
    listed = sqlite_lab.cli("ls", "--json")
    assert listed.returncode == 0, listed
    assert {r["task"]: r["status"] for r in listed.jsonl()} == {"ok": "done", "b\\xffd": "damaged"}


BAD_ROWS = {
    "event time 1e308": "UPDATE events SET ts = 1e308 WHERE task_id = 't'",
    "event time text": "UPDATE events SET ts = 'x' WHERE task_id = 't'",
    "created_at 1e308": "UPDATE tasks SET created_at = 1e308 WHERE id = 't'",
    "created_at text": "UPDATE tasks SET created_at = 'x' WHERE id = 't'",
    "created_at -inf": "UPDATE tasks SET created_at = -1e999 WHERE id = 't'",
    "goal a BLOB": "UPDATE tasks SET goal = X'6869' WHERE id = 't'",
    "tool a BLOB": "UPDATE steps SET tool = X'6869' WHERE task_id = 't'",
    "event kind a BLOB": "UPDATE events SET kind = X'6869' WHERE task_id = 't'",
    # A claim adds one to the epoch: at SQLite's largest integer that made it a
    # float, so the run that refused the task had damaged it.
    "lease_epoch at its largest": f"UPDATE tasks SET lease_epoch = {2**63 - 1} WHERE id = 't'",
    "lease_epoch text": "UPDATE tasks SET lease_epoch = 'x' WHERE id = 't'",
}
#: What the line says of a case beside the task's name, where it says more.
SAYS = {
    "lease_epoch at its largest": "an epoch below 2**63 - 1",
    "lease_epoch text": "holds 'x', not an epoch",
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_a_row_of_the_wrong_type_is_that_task_damaged(two: Lab, case: str) -> None:
    sql(two, BAD_ROWS[case])
    before = digest(two.root / "state.db")
    commands: list[tuple[str, ...]] = (
        [
            ("export", "t", "--format", "otlp-json"),
            ("export", "t"),
            ("report", "t", "-o", "r.html"),
        ]
        if not case.startswith("lease_epoch")
        else []
    )  # the journal's readers never read it
    if case.startswith(("created_at", "goal", "tool", "lease_epoch")):  # rows every command reads
        commands += [("status", "t"), ("run", "t"), ("fork", "t", "t2", "--from", "0")]
    for command in commands:
        one_line(two.cli(*command), 5, "task 't' is damaged", SAYS.get(case, ""))
    listed = two.cli("ls", "--json")
    assert listed.returncode == 0, listed
    statuses = {r["task"]: r["status"] for r in listed.jsonl()}
    assert statuses["u"] == "waiting"
    assert set(statuses) == {"t", "u"}
    json.dumps(listed.jsonl(), allow_nan=False)  # every value listed is plain JSON
    verify = two.cli("verify", "--all")
    assert verify.returncode in (5, 7), verify
    assert "Traceback" not in verify.stderr
    assert "t: damaged: task 't' is damaged" in verify.stdout, verify.stdout
    assert not any(line.startswith("u:") for line in verify.stdout.splitlines())
    assert two.cli("status", "u").returncode == 0
    assert digest(two.root / "state.db") == before
    assert task_ids(two) == ["t", "u"]
