"""What a task can do to a runner and to a fleet, on every backend: a tool this
host lacks, rows it cannot read, output it cannot store, a step that kills its
process every time. Each costs that one task, never the others, never a
traceback, and never an attempt or a journal event for work that did not run."""

from __future__ import annotations

import json
import math
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from fleet import Fleet, expected_artifacts, journal_problems

import ninelives
from ninelives.errors import TaskFailed
from ninelives.plan import plan_from_dict
from ninelives.settings import Settings
from ninelives.testing import Lab
from ninelives.testing.lab import GUIDE_PLAN
from ninelives.tools import Registry
from ninelives.tools.builtin import default_registry

pytestmark = pytest.mark.crash

FAST = ("--lease", "1", "--heartbeat", "0.3", "--poll", "0.05")
SHOUT_PLAN = {"goal": "shout", "steps": [{"tool": "shout", "input": {"text": "hi"}}]}


def url(lab: Lab) -> str:
    return str(lab.sqlite_path) if lab.sqlite_path is not None else lab.db


def execute_sql(lab: Lab, statement: str, params: tuple[Any, ...] = ()) -> None:
    """Change rows behind ninelives' back (damage on purpose), on either backend."""
    if lab.sqlite_path is not None:
        conn = sqlite3.connect(lab.sqlite_path, isolation_level=None)
        try:
            conn.execute(statement.replace("%s", "?"), params)
        finally:
            conn.close()
        return
    import psycopg

    with psycopg.connect(lab.db, autocommit=True) as pg:
        pg.execute(statement, params)  # type: ignore[arg-type]


def in_lab(lab: Lab) -> Settings:
    """Settings whose artifacts folder is the lab's: a task created here records it,
    and the lab's worker and run processes publish there."""
    return Settings(artifacts=str(lab.artifacts_dir))


def with_tools(**tools: Callable[..., Any]) -> Registry:
    registry = default_registry(Settings())
    for name, fn in tools.items():
        registry.register(name, fn)
    return registry


def shout(input: Mapping[str, Any], ctx: Mapping[int, Any], key: str) -> dict[str, Any]:
    return {"text": str(input["text"]).upper()}


@pytest.fixture
def fleet(lab: Lab) -> Iterator[Fleet]:
    lab.guide_setup()
    fleet = Fleet(lab)
    yield fleet
    fleet.close()


# -- A: a tool missing on this host ----------------------------------------------


@pytest.mark.slow
def test_a_tool_missing_here_is_refused_before_anything_is_written(lab: Lab) -> None:
    with ninelives.open(url(lab), settings=in_lab(lab), tools=with_tools(shout=shout)) as rt:
        rt.create("t", SHOUT_PLAN)
    before = lab.fingerprint("t")
    for _ in range(5):
        ran = lab.cli("run", "t")
        assert ran.returncode == 4, ran
        assert ran.stderr.splitlines() == [ran.stderr.splitlines()[-1]]
        assert ran.stderr.startswith("ninelives: error: task 't' step 0 needs unknown tool 'shout'")
    assert lab.fingerprint("t") == before
    snap = lab.snapshot("t")
    assert snap.status["status"] == "pending"
    assert snap.status["steps"][0]["attempts"] == 0
    assert [e["kind"] for e in snap.events] == ["task_created"]
    # Where the tool exists, the task runs as if nothing had happened.
    with ninelives.open(url(lab), settings=in_lab(lab), tools=with_tools(shout=shout)) as rt:
        assert rt.run("t").status.value == "done"


def test_drain_ends_and_names_the_tasks_it_cannot_run(fleet: Fleet) -> None:
    lab = fleet.lab
    with ninelives.open(url(lab), settings=in_lab(lab), tools=with_tools(shout=shout)) as rt:
        rt.create("a", GUIDE_PLAN, queue="default")
        rt.create("s", SHOUT_PLAN, queue="default")
        rt.create("b", GUIDE_PLAN, queue="default")
    worker = fleet.start(*FAST, "--drain", "--concurrency", "2")
    assert worker.wait(60) == 11, worker.log()
    refused = worker.actions("cannot_run")
    assert {r["task"] for r in refused} == {"s"}
    last = worker.log().strip().splitlines()[-1]
    assert last.startswith("ninelives: error: queue 'default' drained except 1 task(s)")
    assert "s: task 's' step 0 needs unknown tool 'shout'" in last
    assert "Traceback" not in worker.log()
    assert sorted(r["task"] for r in worker.actions("done")) == ["a", "b"]
    assert lab.artifacts() == expected_artifacts("a", "b")
    assert [e.kind for e in fleet.events("s")] == ["task_created"]
    assert fleet.store.get_task("s").steps[0].attempts == 0


# -- B: one task's rows cannot be read ---------------------------------------------

DAMAGE = {
    "status": ("UPDATE steps SET status = 'paused' WHERE task_id = %s AND idx = 1", "step 1"),
    "input": ("UPDATE steps SET input = '{not json' WHERE task_id = %s AND idx = 0", "step 0"),
    "task": ("UPDATE tasks SET status = 'archived' WHERE id = %s", "task"),
}


@pytest.mark.slow
def test_a_fleet_runs_every_task_but_the_damaged_ones(fleet: Fleet) -> None:
    lab = fleet.lab
    plan = plan_from_dict(GUIDE_PLAN)
    ids = [f"t{i}" for i in range(6)]
    for task_id in ids:
        fleet.store.create_task(task_id, plan, queue="default")
    damaged = {"t1": "status", "t3": "input"}
    for task_id, kind in damaged.items():
        execute_sql(lab, DAMAGE[kind][0], (task_id,))
    workers = [fleet.start(*FAST, "--drain", "--concurrency", "2") for _ in range(2)]
    codes = [w.wait(90) for w in workers]
    logs = "\n".join(w.log() for w in workers)
    assert codes == [11, 11], logs
    assert "Traceback" not in logs
    assert {r["task"] for w in workers for r in w.actions("damaged")} == set(damaged)
    healthy = [t for t in ids if t not in damaged]
    assert lab.artifacts() == expected_artifacts(*healthy)
    for task_id in healthy:
        assert fleet.store.get_task(task_id).status.value == "done"
        assert journal_problems(fleet.events(task_id)) == []
    for task_id in damaged:  # skipped, not half-claimed: only the creation is journaled
        assert [e.kind for e in fleet.events(task_id)] == ["task_created"]
    # The commands that read a task name the damage in one line, exit 5.
    for task_id, kind in damaged.items():
        for command in (("status", task_id), ("run", task_id)):
            shown = lab.cli(*command)
            assert shown.returncode == 5, shown
            assert len(shown.stderr.strip().splitlines()) == 1
            assert shown.stderr.startswith(
                f"ninelives: error: task {task_id!r} is damaged: {DAMAGE[kind][1]}: "
            )
    verified = lab.cli("verify", "--all")
    assert verified.returncode == 7, verified
    assert "Traceback" not in verified.stderr
    named = [line.split(":")[0] for line in verified.stdout.splitlines() if ": damaged:" in line]
    assert named == sorted(damaged)


@pytest.mark.parametrize("kind", sorted(DAMAGE))
@pytest.mark.slow
def test_status_export_verify_report_a_damaged_task_without_a_traceback(
    lab: Lab, kind: str
) -> None:
    lab.guide_setup()
    for task_id in ("a", "b"):
        assert lab.cli("create", task_id, "plan.json").returncode == 0
    execute_sql(lab, DAMAGE[kind][0], ("a",))
    execute_sql(lab, "UPDATE events SET data = '{oops' WHERE task_id = %s", ("b",))
    status = lab.cli("status", "a")
    assert status.returncode == 5
    assert status.stderr.startswith("ninelives: error: task 'a' is damaged")
    export = lab.cli("export", "b")
    assert export.returncode == 5
    assert export.stderr.startswith("ninelives: error: task 'b' is damaged: journal event seq")
    verified = lab.cli("verify", "--all")
    assert verified.returncode == 7
    assert "Traceback" not in verified.stdout + verified.stderr
    assert verified.stdout.startswith("a: damaged: task 'a' is damaged")
    assert "\nb: damaged: task 'b' is damaged: journal event" in verified.stdout


# -- C and E: output that cannot be stored -------------------------------------------


def returning(value: Any) -> Callable[..., Any]:
    def tool(input: Mapping[str, Any], ctx: Mapping[int, Any], key: str) -> Any:
        return value

    return tool


def raising(message: str) -> Callable[..., Any]:
    def tool(input: Mapping[str, Any], ctx: Mapping[int, Any], key: str) -> Any:
        raise RuntimeError(message)

    return tool


UNSTORABLE = {
    "lone-surrogate": (returning({"reply": "ok \ud800"}), "not valid Unicode text: '\\ud800'"),
    "nan": (returning({"score": math.nan}), "not standard JSON"),
    "infinity": (returning({"score": math.inf}), "not standard JSON"),
    "not-a-dict": (returning("just text"), "the tool returned str, not a JSON object"),
    "list": (returning([1, 2]), "the tool returned list, not a JSON object"),
    "set": (returning({"tags": {"a"}}), "not standard JSON: Object of type set"),
    "too-big": (returning({"text": "x" * 5000}), "exceed the maximum output size of 2048"),
    "error-with-surrogate": (raising("bad \udcff byte"), "RuntimeError: bad \\udcff byte"),
}


@pytest.mark.parametrize("case", sorted(UNSTORABLE))
def test_output_that_cannot_be_stored_is_a_step_error_and_the_task_fails(
    lab: Lab, case: str
) -> None:
    tool, message = UNSTORABLE[case]
    settings = Settings(artifacts=str(lab.root / "artifacts"))
    if case == "too-big":
        settings = settings._replace(max_output=2048)
    plan = {"goal": "g", "steps": [{"tool": "model", "input": {}}]}
    with ninelives.open(url(lab), settings=settings, tools=with_tools(model=tool)) as rt:
        rt.create("t", plan)
        with pytest.raises(TaskFailed, match="failed 3 times"):
            rt.run("t")
        task = rt.status("t")
        events = rt.export("t")
    assert task.status.value == "failed"
    assert (task.steps[0].status.value, task.steps[0].attempts) == ("failed", 3)
    errors = [e.data["error"] for e in events if e.kind == "step_error"]
    assert len(errors) == 3
    assert all(message in error for error in errors), errors
    assert [e.kind for e in events][-1] == "task_failed"
    assert journal_problems(events) == []
    # What was stored reads back as standard JSON everywhere it is printed.
    shown = lab.cli("export", "t")
    assert shown.returncode == 0
    for line in shown.stdout.splitlines():
        json.loads(line, parse_constant=_refuse)


def _refuse(name: str) -> None:
    raise AssertionError(f"non-standard JSON constant {name} printed")


def test_nul_and_odd_text_in_an_output_round_trip(lab: Lab) -> None:
    text = "a\x00b \u2028 \U0001f600 \x7f"
    tool = returning({"text": text, "n": [1, 2.5, None, True]})
    plan = {"goal": "g", "steps": [{"tool": "model", "input": {}}]}
    with ninelives.open(url(lab), settings=in_lab(lab), tools=with_tools(model=tool)) as rt:
        rt.create("t", plan)
        assert rt.run("t").steps[0].output == {"text": text, "n": [1, 2.5, None, True]}
    status = lab.cli("status", "t", "--outputs")
    assert json.loads(status.stdout)["steps"][0]["output"]["text"] == text


@pytest.mark.slow
def test_status_prints_standard_json_for_a_row_written_before_nan_was_refused(
    lab: Lab,
) -> None:
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    assert lab.cli("run", "t").returncode == 0
    execute_sql(
        lab, "UPDATE steps SET output = %s WHERE task_id = 't' AND idx = 0",
        ('{"chars":NaN,"sha256":"x","text":Infinity}',),
    )  # fmt: skip
    status = lab.cli("status", "t", "--outputs")
    assert status.returncode == 0, status
    output = json.loads(status.stdout, parse_constant=_refuse)["steps"][0]["output"]
    assert output == {"chars": None, "sha256": "x", "text": None}


@pytest.mark.parametrize(
    "step_input", [{"n": 1e999}, {"n": [-1e999]}], ids=["infinity", "minus-infinity"]
)
def test_a_plan_number_out_of_range_is_refused(lab: Lab, step_input: dict[str, Any]) -> None:
    lab.write("input/notes.txt", "x")
    plan = {"goal": "g", "steps": [{"tool": "fetch", "input": {"path": "input/notes.txt"}}]}
    text = json.dumps(plan).replace('"input/notes.txt"}', '"input/notes.txt", "n": 1e999}')
    lab.write("plan.json", text)
    before = lab.fingerprint("t")
    created = lab.cli("create", "t", "plan.json")
    assert created.returncode == 4, created
    assert "plan refused: step 0 input is not standard JSON" in created.stderr
    assert lab.fingerprint("t") == before
    step = {"tool": "fetch", "input": {"path": "input/notes.txt", **step_input}}
    with ninelives.open(url(lab)) as rt, pytest.raises(ninelives.PlanError, match="not standard"):
        rt.create("t", {"goal": "g", "steps": [step]})


# -- D: a step that kills its process every time -----------------------------------


@pytest.mark.parametrize("limit", [None, "2", "0"])
@pytest.mark.slow
def test_a_step_that_always_kills_its_process_fails_at_the_recovery_limit(
    lab: Lab, limit: str | None
) -> None:
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    env = {"NINELIVES_MAX_RECOVERIES": limit} if limit is not None else {}
    allowed = int(limit) if limit is not None else 5
    for n in range(allowed + 1):
        killed = lab.cli("run", "t", AGENT_CRASH_AT="before_effect:1", **env)
        assert killed.returncode == -9, (n, killed)
    last = lab.cli("run", "t", AGENT_CRASH_AT="before_effect:1", **env)
    assert last.returncode == 2, last
    reason = f"step 1 was found running after its process died {allowed + 1} times"
    assert reason in last.stderr.splitlines()[-1]
    snap = lab.snapshot("t")
    assert snap.status["status"] == "failed"
    assert [s["status"] for s in snap.status["steps"]] == ["done", "failed", "pending"]
    kinds = [e["kind"] for e in snap.events]
    assert kinds.count("step_recovered") == allowed + 1
    # Failed in the recovery transaction itself: same run, right after run_started.
    assert kinds[-3:] == ["step_recovered", "run_started", "task_failed"]
    assert len({e["run"] for e in snap.events[-3:]}) == 1
    assert snap.events[-1]["step"] == 1
    assert reason in snap.events[-1]["reason"]
    verified = lab.cli("verify", "t")
    assert verified.returncode == 0, verified.stdout
    again = lab.cli("run", "t")
    assert again.returncode == 2
    assert reason in again.stderr  # the stored reason, not a generic one


@pytest.mark.slow
def test_recovered_steps_below_the_limit_still_finish(lab: Lab) -> None:
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    for point in ("before_effect:0", "after_effect:1", "before_effect:2"):
        assert (
            lab.cli("run", "t", AGENT_CRASH_AT=point, NINELIVES_MAX_RECOVERIES="1").returncode == -9
        )
    done = lab.cli("run", "t", NINELIVES_MAX_RECOVERIES="1")
    assert done.returncode == 0, done
    assert lab.artifacts() == expected_artifacts("t")


@pytest.mark.slow
def test_an_output_over_the_maximum_size_is_a_step_error_not_database_unusable(
    lab: Lab,
) -> None:
    # 3000 bytes read, but each newline is two characters of JSON: over 4096 stored.
    lab.write("input/lines.txt", "\n" * 3000)
    lab.write("input/big.txt", "y" * 10_000)
    for task_id, name in (("t", "lines.txt"), ("big", "big.txt")):
        step = {"tool": "fetch", "input": {"path": f"input/{name}"}}
        lab.write_plan({"goal": "g", "steps": [step]})
        assert lab.cli("create", task_id, "plan.json").returncode == 0
    ran = lab.cli("run", "t", NINELIVES_MAX_OUTPUT="4096")
    assert ran.returncode == 2, ran
    assert "exceed the maximum output size of 4096 bytes" in ran.stderr.splitlines()[-1]
    assert "Traceback" not in ran.stderr
    kinds = [e["kind"] for e in lab.cli("export", "t").jsonl()]
    assert kinds.count("step_error") == 3
    assert kinds[-1] == "task_failed"
    # A file over the maximum output is streamed into the blob store by fetch
    # (bounded memory), and the row keeps a reference to it.
    big = lab.cli("run", "big", NINELIVES_MAX_OUTPUT="4096")
    assert big.returncode == 0, big
    assert '"$blob"' in big.stderr


def test_the_new_limits_refuse_values_that_make_no_sense() -> None:
    """The settings refuse limits that make no sense (a negative count, a size
    SQLite cannot store)."""
    from ninelives.errors import InputError

    for env in (
        {"NINELIVES_MAX_RECOVERIES": "-1"},
        {"NINELIVES_MAX_RECOVERIES": "many"},
        {"NINELIVES_MAX_OUTPUT": "100"},
        {"NINELIVES_MAX_OUTPUT": str(2**40)},
    ):
        with pytest.raises(InputError):
            Settings.from_env(env)
    assert Settings.from_env({}).max_recoveries == 5
    assert Settings.from_env({}).max_output == 64 * 1024 * 1024


# -- F: any concurrency gets work on SQLite -----------------------------------------

ONE_STEP = {"goal": "g", "steps": [{"tool": "fetch", "input": {"path": "input/notes.txt"}}]}


def test_sqlite_claims_look_past_the_first_page_of_candidates(tmp_path: Path) -> None:
    from ninelives.store.sqlite.store import SQLiteStore

    db = str(tmp_path / "state.db")
    count = 70  # past a page of candidates (64)
    first = SQLiteStore(db)
    plan = plan_from_dict(ONE_STEP)
    for i in range(count):
        first.create_task(f"t{i:03d}", plan, queue="q")
    stores = [first, *(SQLiteStore(db) for _ in range(count))]
    try:
        claimed = [store.claim_next("q", f"r{i}") for i, store in enumerate(stores)]
        assert sorted(c[0].task_id for c in claimed if c is not None) == [
            f"t{i:03d}" for i in range(count)
        ]
        assert claimed[-1] is None  # one store more than tasks
    finally:
        for store in stores:
            store.close()


@pytest.mark.slow
def test_a_worker_with_70_slots_runs_70_tasks_at_once(sqlite_lab: Lab) -> None:
    lab = sqlite_lab
    lab.guide_setup()
    fleet = Fleet(lab)
    try:
        plan = plan_from_dict(ONE_STEP)
        for i in range(70):
            fleet.store.create_task(f"t{i:02d}", plan, queue="default")
        worker = fleet.start(*FAST, "--concurrency", "70", "--grace", "0", AGENT_STEP_DELAY="600")
        assert lab.sqlite_path is not None
        deadline = time.monotonic() + 120
        running = 0
        while running < 70:
            assert time.monotonic() < deadline, f"{running} of 70 running\n{worker.log()}"
            assert worker.proc.poll() is None, worker.log()
            time.sleep(0.2)
            conn = sqlite3.connect(lab.sqlite_path)
            try:
                running = conn.execute(
                    "SELECT count(*) FROM steps WHERE status = 'running'"
                ).fetchone()[0]
            finally:
                conn.close()
        worker.signal(signal.SIGTERM)
        assert worker.wait(60) == 0, worker.log()
        assert len({r["task"] for r in worker.actions("claimed")}) == 70
    finally:
        fleet.close()


# -- G: the worker's exit code for an unknown outcome is the CLI's ---------------


def test_the_worker_fail_stop_code_is_the_cli_code_of_commit_unknown() -> None:
    from ninelives.cli import exit_code
    from ninelives.errors import CommitUnknown, EffectUnknown, TasksLeft
    from ninelives.worker import EXIT_OUTCOME_UNKNOWN

    assert exit_code(CommitUnknown("x")) == EXIT_OUTCOME_UNKNOWN == 6
    assert exit_code(EffectUnknown("x")) == 6
    assert exit_code(TasksLeft("x")) == 11


class _Ends(BaseException):
    """A library's own BaseException: not an error the runner takes for the tool's
    (``sys.exit`` is one: see ninelives.policy.USER_ERRORS), so it ends the thread."""


def test_a_worker_whose_slots_all_ended_does_not_exit_0(tmp_path: Path) -> None:
    """A tool that ends its thread ends a slot; once every slot has ended without
    a stop or a drain, the worker says so."""
    from ninelives.errors import StoreError
    from ninelives.worker import Worker, WorkerOptions

    def leaves(input: Mapping[str, Any], ctx: Mapping[int, Any], key: str) -> Any:
        raise _Ends

    db = str(tmp_path / "state.db")
    tools = with_tools(leaves=leaves)
    with ninelives.open(db, tools=tools) as rt:
        for task_id in ("a", "b"):
            rt.create(task_id, {"goal": "g", "steps": [{"tool": "leaves", "input": {}}]},
                      queue="default")  # fmt: skip
    lines: list[str] = []
    options = WorkerOptions.from_env(db, concurrency=2, poll=0.05, env={})
    worker = Worker(options, settings=Settings(), tools=tools, log=lines.append)
    with pytest.raises(StoreError, match="2 worker slot"):
        worker.run()
    assert sum("action=slot_ended" in line for line in lines) == 2, lines
