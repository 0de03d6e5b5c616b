"""Every registered crash point, killed for real, then resumed and proven.

Parametrised over :data:`ninelives.crashpoints.POINTS`, so a newly registered
point is exercised without touching this file: points that need a particular
state get a scenario below; any other is reached by the guide's plan with
``AGENT_CRASH_AT=POINT`` (and the test fails until it is). Each case requires
the killed process to exit -9 (proof the point was reached), resumes the task,
and checks the five properties and ``ninelives verify --artifacts``; on the
SQLite store and on the PostgreSQL one.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from ninelives import crashpoints
from ninelives.store import sql
from ninelives.testing import Lab, Snapshot, five_property_violations
from ninelives.testing.lab import GUIDE_PLAN
from ninelives.testing.simulation import write_legacy_database

pytestmark = pytest.mark.crash

TASK = "t"
SUMMARY = "Line one\nLine two\nLine three"
EXPECTED = {f"{TASK}-2.md": SUMMARY}
SRC = Path(__file__).resolve().parents[2] / "src" / "ninelives"
LATEST = sql.migrations("sqlite")[-1][0]

#: A scenario leaves the task killed and returns the snapshot to compare the
#: resumed task with (None: nothing was committed before) and how many run
#: processes wrote a ``run_started`` so far.
Scenario = Callable[[Lab], tuple[Snapshot | None, int]]


def _killed(lab: Lab, *args: str, at: str) -> None:
    result = lab.cli(*args, AGENT_CRASH_AT=at)
    assert result.returncode == -9, f"{at} was not reached: {result}"


def _created(lab: Lab) -> None:
    lab.guide_setup()
    assert lab.cli("create", TASK, "plan.json").returncode == 0


def _at_step(point: str, step: int = 2) -> Scenario:
    def scenario(lab: Lab) -> tuple[Snapshot | None, int]:
        _created(lab)
        _killed(lab, "run", TASK, at=f"{point}:{step}")
        return lab.snapshot(TASK), 1

    return scenario


def _anywhere(point: str) -> Scenario:
    def scenario(lab: Lab) -> tuple[Snapshot | None, int]:
        _created(lab)
        _killed(lab, "run", TASK, at=point)
        return lab.snapshot(TASK), 1

    return scenario


def _create(lab: Lab) -> tuple[Snapshot | None, int]:
    lab.guide_setup()
    _killed(lab, "create", TASK, "plan.json", at="create_before_commit")
    assert lab.cli("status", TASK).returncode == 1  # nothing of the task was stored
    assert lab.cli("create", TASK, "plan.json").returncode == 0
    return None, 0


def _recovery(lab: Lab) -> tuple[Snapshot | None, int]:
    _created(lab)
    _killed(lab, "run", TASK, at="before_effect:2")
    before = lab.snapshot(TASK)
    _killed(lab, "run", TASK, at="recovery_before_commit")
    assert lab.snapshot(TASK) == before  # the recovery transaction left no trace
    return before, 1


def _after_recovery(lab: Lab) -> tuple[Snapshot | None, int]:
    _created(lab)
    _killed(lab, "run", TASK, at="before_effect:2")
    before = lab.snapshot(TASK)
    _killed(lab, "run", TASK, at="after_recovery")
    return before, 2


def _error(lab: Lab) -> tuple[Snapshot | None, int]:
    _created(lab)
    notes = lab.root / "input" / "notes.txt"
    text = notes.read_text(encoding="utf-8")
    notes.unlink()  # fetch fails, so the run reaches record_error
    _killed(lab, "run", TASK, at="error_before_commit:0")
    before = lab.snapshot(TASK)
    assert before.steps_with("running") == {0}
    assert "step_error" not in [e["kind"] for e in before.events]  # rolled back with the kill
    notes.write_text(text, encoding="utf-8")
    return before, 1


def _legacy_columns(lab: Lab) -> tuple[int, list[str]]:
    conn = sqlite3.connect(lab.root / "state.db")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        columns = [row[1] for row in conn.execute("PRAGMA table_info(tasks)")]
    finally:
        conn.close()
    return version, columns


def _pg_tables(url: str) -> set[str]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        ).fetchall()
    return {str(row[0]) for row in rows}


def _migration(lab: Lab, at: str = "migration_before_commit") -> tuple[Snapshot | None, int]:
    lab.guide_setup()
    if lab.sqlite_path is None:
        # A fresh PostgreSQL database: the first command migrates it, in one
        # transaction that the kill rolls back whole.
        _killed(lab, "create", TASK, "plan.json", at=at)
        assert _pg_tables(lab.db) == set(), "the killed migration was committed"
        assert lab.cli("create", TASK, "plan.json").returncode == 0
        return None, 0
    write_legacy_database(str(lab.root / "state.db"), GUIDE_PLAN, {}, task_id=TASK)
    _killed(lab, "run", TASK, at=at)
    version, columns = _legacy_columns(lab)
    assert version == 0, "the killed migration was committed"
    assert "lease_epoch" not in columns, columns
    return None, 0


def _all_steps_done(lab: Lab, outputs: dict[int, object]) -> None:
    """On PostgreSQL, the state the guide's code leaves on SQLite (every step
    done, the task not), made through the store by a run that then ended."""
    from ninelives.journal import dumps
    from ninelives.plan import plan_from_dict
    from ninelives.store import open_store

    store = open_store(lab.db)
    try:
        store.create_task(TASK, plan_from_dict(GUIDE_PLAN))
        run, _ = store.begin_run(TASK, "0" * 32)
        for idx, step in enumerate(GUIDE_PLAN["steps"]):
            store.start_step(run, idx, step["tool"])
            store.finish_step(run, idx, step["tool"], dumps(outputs[idx]), last=False)
        store.end_run(run)
    finally:
        store.close()


def _task_done(lab: Lab) -> tuple[Snapshot | None, int]:
    """The guide's own code commits ``task_done`` apart from the last step: a
    database it left between the two has every step done and the task not."""
    base = Lab(lab.root.parent / "base")
    base.guide_setup()
    assert base.cli("create", TASK, "plan.json").returncode == 0
    assert base.cli("run", TASK).returncode == 0
    outputs = {s["idx"]: s["output"] for s in base.snapshot(TASK).status["steps"]}
    lab.guide_setup()
    shutil.copytree(base.root / "artifacts", lab.root / "artifacts")
    if lab.sqlite_path is None:
        _all_steps_done(lab, outputs)
    else:
        write_legacy_database(str(lab.root / "state.db"), GUIDE_PLAN, outputs, task_id=TASK)
    _killed(lab, "run", TASK, at="before_task_done")
    before = lab.snapshot(TASK)
    assert before.status["status"] == "running"
    return before, 2


#: The guide's fetch, checkpointing before it reads (a module named in NINELIVES_TOOLS).
CHECKPOINTING_FETCH = """
from ninelives.tools import Tool


def register(registry):
    original = registry.lookup("fetch")

    def fetch(step_input, context):
        context.checkpoint({"seen": (context.progress or {}).get("seen", 0) + 1})
        return original.run(step_input, context)

    registry.add(Tool(name="fetch", fn=fetch, takes_context=True))
"""


def _checkpoint(lab: Lab) -> tuple[Snapshot | None, int]:
    _created(lab)
    lab.write("cptools.py", CHECKPOINTING_FETCH)
    lab.base_env["NINELIVES_TOOLS"] = "cptools"  # the resumed run checkpoints too
    _killed(lab, "run", TASK, at="checkpoint_before_commit:0")
    before = lab.snapshot(TASK)
    assert "step_progress" not in [e["kind"] for e in before.events]  # rolled back
    return before, 1


def _side_task(lab: Lab, steps: list[dict[str, object]]) -> None:
    """A task ``side`` of the tools in effect_tools.py (counted effects, probes)."""
    shutil.copy(Path(__file__).with_name("effect_tools.py"), lab.root / "effect_tools.py")
    lab.base_env["NINELIVES_TOOLS"] = "effect_tools"
    lab.write_plan({"goal": "side", "steps": steps}, "side.json")
    assert lab.cli("create", "side", "side.json").returncode == 0


def _probe_point(point: str) -> Scenario:
    """Killed after a probe answered (or inside the answer's commit): nothing of the
    answer is kept, the step is still running, the next run probes again and
    reconciles; the effect ran once. Then the guide's task, killed nowhere."""

    def scenario(lab: Lab) -> tuple[Snapshot | None, int]:
        _side_task(lab, [{"tool": "charge_probe", "input": {}}])
        _killed(lab, "run", "side", at="after_effect:0")
        _killed(lab, "run", "side", at=f"{point}:0")
        assert lab.snapshot("side").steps_with("running") == {0}
        assert lab.cli("run", "side").returncode == 0
        assert (lab.root / "effects.log").read_text().splitlines() == ["side-0"]
        assert lab.cli("verify", "side").returncode == 0
        _created(lab)
        return None, 0

    return scenario


def _decision(lab: Lab) -> tuple[Snapshot | None, int]:
    """``approve`` killed before its commit: the step still waits; approved again, it runs on."""
    _side_task(lab, [{"tool": "approval", "input": {"prompt": "ok?"}}])
    assert lab.cli("run", "side").returncode == 8
    waiting = lab.snapshot("side")
    _killed(lab, "approve", "side", "0", at="decision_before_commit")
    assert lab.snapshot("side") == waiting
    assert lab.cli("approve", "side", "0").returncode == 0
    assert lab.cli("run", "side").returncode == 0
    assert lab.cli("verify", "side").returncode == 0
    _created(lab)
    return None, 0


def _blob(lab: Lab) -> tuple[Snapshot | None, int]:
    """Every output goes to the blob store (threshold 0): killed once step 0's
    blob is stored and before the commit that refers to it. The resumed run
    (default threshold) stores it in the row; the blob is left for gc."""
    _created(lab)
    result = lab.cli("run", TASK, AGENT_CRASH_AT="blob_before_reference:0",
                     NINELIVES_BLOB_THRESHOLD="0")  # fmt: skip
    assert result.returncode == -9, f"blob_before_reference was not reached: {result}"
    before = lab.snapshot(TASK)
    assert before.steps_with("running") == {0}
    return before, 1


def _gc(lab: Lab) -> tuple[Snapshot | None, int]:
    """A gc killed inside its batch: the finished task, its steps and its
    journal are all still there, and a run of it finds it done."""
    _created(lab)
    assert lab.cli("run", TASK).returncode == 0
    before = lab.snapshot(TASK)
    _killed(lab, "gc", "--older-than", "0s", at="gc_before_commit")
    assert lab.snapshot(TASK) == before  # the batch's deletes were rolled back whole
    return before, 1


SCENARIOS: dict[str, Scenario] = {
    "blob_before_reference": _blob,
    "probe_answered": _probe_point("probe_answered"),
    "settle_before_commit": _probe_point("settle_before_commit"),
    "decision_before_commit": _decision,
    "before_effect": _at_step("before_effect"),
    "after_effect": _at_step("after_effect"),
    "after_commit": _at_step("after_commit"),
    "artifact_before_link": _at_step("artifact_before_link"),
    "artifact_before_dirsync": _at_step("artifact_before_dirsync"),
    "create_before_commit": _create,
    "recovery_before_commit": _recovery,
    "after_recovery": _after_recovery,
    "migration_before_commit": _migration,
    # After the first statement of the newest migration (more in tests/upgrade).
    "migration_statement": lambda lab: _migration(lab, f"migration_statement:{LATEST}"),
    "error_before_commit": _error,
    "before_task_done": _task_done,
    "checkpoint_before_commit": _checkpoint,
    "gc_before_commit": _gc,
}


@pytest.mark.parametrize("point", list(crashpoints.POINTS))
def test_every_crash_point(lab: Lab, point: str) -> None:
    """On both stores (``lab`` is parametrised over SQLite and PostgreSQL)."""
    scenario = SCENARIOS.get(point, _anywhere(point))
    before, runs = scenario(lab)
    temps = [n for n in lab.artifacts() if n.endswith(".tmp")]
    if point == "artifact_before_link":
        assert temps, "a kill before the link leaves the temporary file behind"
    resumed = lab.cli("run", TASK)
    assert resumed.returncode == 0, resumed
    after = lab.snapshot(TASK)
    problems = five_property_violations(
        plan=GUIDE_PLAN,
        after=after,
        before=before,
        runs=runs + 1,
        artifacts=lab.artifacts(),
        expected_artifacts=EXPECTED,
    )
    assert problems == [], problems
    verified = lab.cli("verify", TASK, "--artifacts", "artifacts")
    assert verified.returncode == 0, verified


# -- every point in the code is registered, and every registered point is in the code --

CRASH_CALL = re.compile(r"crashpoints\.crash\(\s*[\"']([A-Za-z0-9_]+)[\"']")


def crash_calls(sources: dict[str, str]) -> dict[str, set[str]]:
    """Point names passed to ``crashpoints.crash(...)`` in each source text."""
    return {name: set(CRASH_CALL.findall(text)) for name, text in sources.items()}


def registry_mismatch(sources: dict[str, str], registered: set[str]) -> list[str]:
    """Names used but not registered, and registered but never used."""
    used: set[str] = set().union(*crash_calls(sources).values())
    return [f"unregistered: {n}" for n in sorted(used - registered)] + [
        f"never used: {n}" for n in sorted(registered - used)
    ]


def _sources() -> dict[str, str]:
    return {str(p): p.read_text(encoding="utf-8") for p in sorted(SRC.rglob("*.py"))}


def test_code_and_registry_name_the_same_points() -> None:
    assert registry_mismatch(_sources(), set(crashpoints.POINTS)) == []


def test_registry_check_catches_both_directions() -> None:
    """Negative control: a stray name in the code, and a name nothing calls."""
    sources = {
        "a.py": 'crashpoints.crash("before_effect", step.idx)\ncrashpoints.crash(\n  "typo_point")',
    }
    assert registry_mismatch(sources, {"before_effect", "ghost"}) == [
        "unregistered: typo_point",
        "never used: ghost",
    ]


def test_an_unknown_point_is_bad_input(sqlite_lab: Lab) -> None:
    _created(sqlite_lab)
    result = sqlite_lab.cli("run", TASK, AGENT_CRASH_AT="no_such_point")
    assert result.returncode == 4, result
    assert "unknown crash point" in result.stderr
