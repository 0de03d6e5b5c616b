"""``ninelives verify``: clean databases pass, and every kind of damage is reported
with the journal events involved (exit 7) — each check has its negative control."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from ninelives.cli import EXIT_CODES
from ninelives.errors import VerificationFailed
from ninelives.models import Event, Step, StepStatus, Task, TaskStatus
from ninelives.testing import Lab, Result
from ninelives.verify import check_task

VIOLATIONS = 7
TASK = "t"


def _done(lab: Lab, *, crash: str | None = None) -> None:
    """The guide's task, optionally killed once at ``crash``, then run to the end."""
    lab.guide_setup()
    assert lab.cli("create", TASK, "plan.json").returncode == 0
    if crash is not None:
        assert lab.cli("run", TASK, AGENT_CRASH_AT=crash).returncode == -9
    assert lab.cli("run", TASK).returncode == 0


def _verify(lab: Lab, *args: str) -> Result:
    return lab.cli("verify", *args)


def _violations(result: Result) -> list[str]:
    assert result.returncode == VIOLATIONS, result
    assert result.stderr.strip().endswith("violation(s) found"), result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stdout.splitlines()
    assert re.fullmatch(r"verified \d+ task\(s\), \d+ event\(s\).*: \d+ violation\(s\)", lines[-1])
    return lines[:-1]


def _sql(lab: Lab, *statements: str) -> None:
    conn = sqlite3.connect(lab.root / "state.db", isolation_level=None)
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


def _seq(lab: Lab, kind: str, step: int | None = None) -> int:
    rows = [
        e["seq"]
        for e in lab.cli("export", TASK).jsonl()
        if e["kind"] == kind and (step is None or e["step"] == step)
    ]
    assert rows, kind
    return int(rows[-1])


def test_exit_code_7_is_documented() -> None:
    from ninelives.cli import EPILOG

    assert (VerificationFailed, VIOLATIONS) in EXIT_CODES
    assert f"{VIOLATIONS}  verify or torture found violations" in EPILOG


def test_clean_after_a_kill_and_a_resume(lab: Lab) -> None:
    _done(lab, crash="after_effect:2")
    result = _verify(lab, TASK, "--artifacts", "artifacts")
    assert result.returncode == 0, result
    assert result.stdout.endswith(": no violations\n")
    assert _verify(lab, "--all", "--artifacts", "artifacts").returncode == 0


def test_a_killed_task_not_yet_resumed_is_consistent(lab: Lab) -> None:
    """A step left running with its start still open is what a kill leaves: not a violation."""
    lab.guide_setup()
    assert lab.cli("create", TASK, "plan.json").returncode == 0
    assert lab.cli("run", TASK, AGENT_CRASH_AT="artifact_before_link:2").returncode == -9
    result = _verify(lab, TASK)
    assert result.returncode == 0, result


def test_verify_changes_nothing(sqlite_lab: Lab) -> None:
    _done(sqlite_lab)
    before = sqlite_lab.fingerprint(TASK)
    assert _verify(sqlite_lab, "--all", "--artifacts", "artifacts").returncode == 0
    assert sqlite_lab.fingerprint(TASK) == before


Damage = Callable[[Lab], None]


def _status_disagrees(lab: Lab) -> None:
    _sql(lab, f"UPDATE steps SET status = 'pending' WHERE task_id = '{TASK}' AND idx = 1")


def _finish_lost(lab: Lab) -> None:
    seq = _seq(lab, "step_finished", 1)
    _sql(lab, f"DELETE FROM events WHERE seq = {seq}")


def _second_run_started(lab: Lab) -> None:
    _sql(
        lab,
        "INSERT INTO events (ts, task_id, run_id, kind, step_idx, data) "
        f"SELECT ts, task_id, run_id, kind, step_idx, data FROM events "
        f"WHERE task_id = '{TASK}' AND kind = 'run_started'",
    )


def _output_missing(lab: Lab) -> None:
    _sql(lab, f"UPDATE steps SET output = NULL WHERE task_id = '{TASK}' AND idx = 0")


def _finished_twice(lab: Lab) -> None:
    _sql(
        lab,
        "INSERT INTO events (ts, task_id, run_id, kind, step_idx, data) "
        f"SELECT ts, task_id, run_id, kind, step_idx, data FROM events "
        f"WHERE task_id = '{TASK}' AND kind = 'step_finished' AND step_idx = 0",
    )


def _attempts_off(lab: Lab) -> None:
    _sql(lab, f"UPDATE steps SET attempts = 5 WHERE task_id = '{TASK}' AND idx = 2")


def _task_not_done(lab: Lab) -> None:
    _sql(lab, f"UPDATE tasks SET status = 'running' WHERE id = '{TASK}'")


def _start_never_closed(lab: Lab) -> None:
    seq = _seq(lab, "step_started", 2)
    _sql(
        lab,
        "INSERT INTO events (ts, task_id, run_id, kind, step_idx, data) "
        f"SELECT ts, task_id, run_id, kind, step_idx, data FROM events WHERE seq = {seq}",
    )


DAMAGE: dict[str, tuple[Damage, str, str | None]] = {
    # name: (damage, check that must report it, event kind whose seq it must name)
    "step status": (_status_disagrees, "step_status", "step_finished"),
    "finish lost": (_finish_lost, "journal", "step_started"),
    "run_started twice": (_second_run_started, "journal", "run_started"),
    "output missing": (_output_missing, "output", "step_finished"),
    "finished twice": (_finished_twice, "finished_twice", "step_finished"),
    "attempts": (_attempts_off, "attempts", "step_started"),
    "task status": (_task_not_done, "task_status", "task_done"),
    "start never closed": (_start_never_closed, "open_step", "step_started"),
}


@pytest.mark.parametrize("name", list(DAMAGE))
def test_each_kind_of_damage_is_reported_with_its_events(sqlite_lab: Lab, name: str) -> None:
    damage, check, kind = DAMAGE[name]
    _done(sqlite_lab)
    assert _verify(sqlite_lab, TASK).returncode == 0  # clean before the damage
    damage(sqlite_lab)
    lines = _violations(_verify(sqlite_lab, TASK))
    found = [line for line in lines if line.startswith(f"{TASK}: {check}: ")]
    assert found, lines
    if kind is not None:
        seqs = {e["seq"] for e in sqlite_lab.cli("export", TASK).jsonl() if e["kind"] == kind}
        named = {int(n) for line in found for n in re.findall(r"\d+", line.split("[seq")[-1])}
        assert any("[seq " in line for line in found), found
        assert named & seqs, (found, seqs)


@pytest.mark.slow
def test_artifact_damage_is_reported(sqlite_lab: Lab) -> None:
    _done(sqlite_lab, crash="after_effect:2")
    artifacts = sqlite_lab.root / "artifacts"
    final = artifacts / f"{TASK}-2.md"
    finished = _seq(sqlite_lab, "step_finished", 2)

    final.write_text(final.read_text() + "\nand again", encoding="utf-8")
    lines = _violations(_verify(sqlite_lab, TASK, "--artifacts", "artifacts"))
    assert lines == [
        f"{TASK}: artifact_content: step 2: {TASK}-2.md holds {len(final.read_bytes())} bytes "
        f"that do not match the sha256 its committed output records [seq {finished}]"
    ]

    final.unlink()
    (artifacts / f".{TASK}-2.md.0123456789abcdef.tmp").write_text("partial", encoding="utf-8")
    lines = _violations(_verify(sqlite_lab, "--all", "--artifacts", "artifacts"))
    assert lines == [
        f"{TASK}: artifact_missing: step 2: {TASK}-2.md is not in artifacts [seq {finished}]",
        f"{TASK}: stray_temp: temporary file .{TASK}-2.md.0123456789abcdef.tmp left in artifacts",
    ]
    # Without --artifacts the files are not looked at.
    assert _verify(sqlite_lab, TASK).returncode == 0


@pytest.mark.parametrize("args", [(TASK,), ("--all",)])
def test_an_empty_artifacts_folder_is_bad_input(sqlite_lab: Lab, args: tuple[str, ...]) -> None:
    # `--artifacts "$DIR"` with DIR unset: the working directory was checked instead,
    # every artifact reported missing from "" (exit 7), or found in the wrong place.
    _done(sqlite_lab)
    result = _verify(sqlite_lab, *args, "--artifacts", "")
    assert result.returncode == 4, result
    assert result.stdout == "", result
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert "--artifacts" in result.stderr, result.stderr
    assert _verify(sqlite_lab, *args, "--artifacts", "artifacts").returncode == 0  # control


def test_an_artifact_changed_at_the_same_length_is_reported(sqlite_lab: Lab) -> None:
    """Other bytes of the same length: only the sha256 tells them from the published text."""
    _done(sqlite_lab)
    final = sqlite_lab.root / "artifacts" / f"{TASK}-2.md"
    published = final.read_bytes()
    changed = published.swapcase()
    assert changed != published
    assert len(changed) == len(published)
    final.write_bytes(changed)
    lines = _violations(_verify(sqlite_lab, TASK, "--artifacts", "artifacts"))
    finished = _seq(sqlite_lab, "step_finished", 2)
    assert lines == [
        f"{TASK}: artifact_content: step 2: {TASK}-2.md holds {len(changed)} bytes "
        f"that do not match the sha256 its committed output records [seq {finished}]"
    ]
    final.write_bytes(published)  # control: the published text itself is clean
    assert _verify(sqlite_lab, TASK, "--artifacts", "artifacts").returncode == 0


def test_a_step_finished_naming_another_blob_is_reported(sqlite_lab: Lab) -> None:
    """Every output a blob; step 1's step_finished is made to name step 0's blob:
    ``output_blob`` reports it with that event's seq."""
    lab = sqlite_lab
    lab.guide_setup()
    assert lab.cli("create", TASK, "plan.json").returncode == 0
    assert lab.cli("run", TASK, NINELIVES_BLOB_THRESHOLD="0").returncode == 0
    assert _verify(lab, TASK).returncode == 0  # clean before the damage
    events = lab.cli("export", TASK).jsonl()
    finished = {e["step"]: e for e in events if e["kind"] == "step_finished"}
    other, own = finished[0]["blob"], finished[1]["blob"]
    assert other != own
    seq = finished[1]["seq"]
    _sql(
        lab,
        f"UPDATE events SET data = json_set(data, '$.blob.sha256', '{other['sha256']}', "
        f"'$.blob.size', {other['size']}) WHERE seq = {seq}",
    )
    lines = _violations(_verify(lab, TASK))
    assert lines == [
        f"{TASK}: output_blob: step 1: its step_finished records blob {other} "
        f"but its output is blob {own} [seq {seq}]"
    ]


@pytest.mark.slow
def test_only_the_damaged_task_is_reported(sqlite_lab: Lab) -> None:
    _done(sqlite_lab)
    assert sqlite_lab.cli("create", "other", "plan.json").returncode == 0
    assert sqlite_lab.cli("run", "other").returncode == 0
    _attempts_off(sqlite_lab)
    lines = _violations(_verify(sqlite_lab, "--all", "--artifacts", "artifacts"))
    assert lines
    assert all(line.startswith(f"{TASK}: ") for line in lines), lines
    assert _verify(sqlite_lab, "other", "--artifacts", "artifacts").returncode == 0


def test_damaged_pages_are_found_by_quick_check(sqlite_lab: Lab) -> None:
    _done(sqlite_lab)
    path = sqlite_lab.root / "state.db"
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        root = conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = 'events_task_seq'"
        ).fetchone()[0]
    finally:
        conn.close()
    with open(path, "r+b") as fh:
        fh.seek((root - 1) * page)
        fh.write(b"\x0d" + b"\xff" * 64)  # a leaf page header with impossible cell counts
    lines = _violations(_verify(sqlite_lab, "--all"))
    assert lines[0].startswith("(database): integrity: Page "), lines
    assert f"{TASK}: unreadable: cannot read database" in lines[-1], lines


@pytest.mark.parametrize(
    ("args", "code"),
    [
        ((), 4),
        ((TASK, "--all"), 4),
        (("nope",), 1),
        ((TASK, "--artifacts", "plan.json"), 4),
    ],
)
def test_bad_input(sqlite_lab: Lab, args: tuple[str, ...], code: int) -> None:
    _done(sqlite_lab)
    before = sqlite_lab.fingerprint(TASK)
    result = _verify(sqlite_lab, *args)
    assert result.returncode == code, result
    assert len(result.stderr.splitlines()) == 1
    assert "Traceback" not in result.stderr
    assert sqlite_lab.fingerprint(TASK) == before


def test_all_without_a_database_is_refused(tmp_path: Path) -> None:
    lab = Lab(tmp_path / "empty")
    result = lab.cli("verify", "--all")
    assert result.returncode == 5, result
    assert not (lab.root / "state.db").exists()


# -- the pure checks, on journals no CLI run produces -------------------------


def _step(idx: int, status: StepStatus, attempts: int, output: dict[str, str] | None) -> Step:
    return Step(
        task_id="p", idx=idx, tool="fetch", input={}, status=status, output=output,
        attempts=attempts,
    )  # fmt: skip


def _ev(seq: int, kind: str, step: int | None = None, run: str = "r1") -> Event:
    return Event(seq=seq, ts=0.0, task_id="p", run_id=run, kind=kind, step_idx=step, data={})


def test_a_failed_task_is_consistent() -> None:
    """Attempts used up (a crash counts as one), step and task failed: no violation."""
    task = Task(
        id="p", goal="", status=TaskStatus.FAILED, created_at=0, updated_at=0,
        steps=(_step(0, StepStatus.FAILED, 2, None),),
    )  # fmt: skip
    events = [
        _ev(1, "task_created", run="c"),
        _ev(2, "run_started"),
        _ev(3, "step_started", 0),
        _ev(4, "step_recovered", 0, run="r2"),
        _ev(5, "run_started", run="r2"),
        _ev(6, "step_started", 0, run="r2"),
        _ev(7, "step_error", 0, run="r2"),
        _ev(8, "task_failed", 0, run="r2"),
    ]
    assert check_task(task, events) == []
    # Negative control: the same journal with the step still pending.
    pending = Task(
        id="p", goal="", status=TaskStatus.FAILED, created_at=0, updated_at=0,
        steps=(_step(0, StepStatus.PENDING, 2, None),),
    )  # fmt: skip
    assert [v.check for v in check_task(pending, events)] == ["step_status"]


def test_task_created_must_come_first_and_once() -> None:
    task = Task(
        id="p", goal="", status=TaskStatus.PENDING, created_at=0, updated_at=0,
        steps=(_step(0, StepStatus.PENDING, 0, None),),
    )  # fmt: skip
    assert check_task(task, [_ev(1, "task_created")]) == []
    found = check_task(task, [_ev(1, "task_created"), _ev(2, "task_created")])
    assert [(v.check, v.seqs) for v in found] == [("task_created", (1, 2))]


# -- limits: a step run again past the attempt or recovery limit --------------------


@pytest.mark.slow
def test_verify_reports_steps_run_past_the_attempt_and_recovery_limits(tmp_path: Path) -> None:
    lab = Lab(tmp_path / "lab")
    lab.write("input/notes.txt", "one\ntwo\nthree\n")
    lab.write_plan({"goal": "g", "steps": [{"tool": "fetch", "input": {"path": "input/none"}}]})
    assert lab.cli("create", "errs", "plan.json").returncode == 0
    assert lab.cli("run", "errs", AGENT_MAX_ATTEMPTS="5").returncode == 2
    lab.guide_setup()
    assert lab.cli("create", "dies", "plan.json").returncode == 0
    for _ in range(8):
        killed = lab.cli(
            "run", "dies", AGENT_CRASH_AT="before_effect:0", NINELIVES_MAX_RECOVERIES="99"
        )
        assert killed.returncode == -9
    # Checked against the limits verify itself runs with: those of the runs pass.
    lenient = lab.cli("verify", "--all", AGENT_MAX_ATTEMPTS="5", NINELIVES_MAX_RECOVERIES="99")
    assert lenient.returncode == 0, lenient.stdout
    strict = lab.cli("verify", "--all")
    assert strict.returncode == 7
    lines = strict.stdout.splitlines()
    assert any(
        line.startswith("errs: attempt_limit: step 0 has 5 step_error events") for line in lines
    ), lines
    assert any(
        line.startswith("dies: recovery_limit: step 0 has 7 step_recovered events")
        for line in lines
    ), lines


@pytest.mark.parametrize("damage", ["changed", "missing"])
def test_a_damaged_blob_is_named_with_the_events_read(sqlite_lab: Lab, damage: str) -> None:
    """A task whose output blob is damaged or missing: its journal is still read
    whole, and the summary counts its events (it said "0 event(s)", as if there
    were no journal to check)."""
    lab = sqlite_lab
    lab.guide_setup()
    assert lab.cli("create", TASK, "plan.json").returncode == 0
    assert lab.cli("run", TASK, NINELIVES_BLOB_THRESHOLD="0").returncode == 0
    events = len(lab.cli("export", TASK).jsonl())
    blob = next(e for e in lab.cli("export", TASK).jsonl() if e["kind"] == "step_finished")
    path = lab.root / "state.db.blobs" / blob["blob"]["sha256"]
    if damage == "missing":
        path.unlink()
    else:
        path.write_bytes(b"not what was stored")
    result = _verify(lab, TASK)
    lines = _violations(result)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{TASK}: blob: task {TASK!r} step 0: its output blob "), lines
    assert ("is missing" if damage == "missing" else "SHA-256") in lines[0], lines
    summary = result.stdout.splitlines()[-1]
    assert summary.startswith(f"verified 1 task(s), {events} event(s)"), summary
    assert events > 0
