"""Group commit (``worker --group-commit``), killed for real, fenced, and its control.

A worker with 16 slots runs 16 tasks of ``charge_rerun`` steps, whose effect is
counted outside the process (tests/crash/effect_tools.py), and is SIGKILLed
while it works (each time after a seeded number of new effects), several times,
then drained. The contract of a
``rerun`` step: its effect runs at least once, and only ever after a durable
``step_started`` of that step, so the count of a step's effects never exceeds
the ``step_started`` events its journal holds. The negative control releases
callers before their batch commits (a test-only switch) and breaks exactly
that. The fencing test batches a fenced write with three good ones.
"""

from __future__ import annotations

import random
import shutil
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from ninelives.errors import CommitUnknown, LeaseLost
from ninelives.plan import plan_from_dict
from ninelives.store.sqlite.group import GroupCommitter
from ninelives.store.sqlite.store import SQLiteStore
from ninelives.testing import Lab

TOOLS = Path(__file__).with_name("effect_tools.py")
TASKS = 16
STEPS = 8
PLAN = {"goal": "pay", "steps": [{"tool": "charge_rerun", "input": {}}] * STEPS}


def _setup(lab: Lab) -> None:
    shutil.copy(TOOLS, lab.root / "effect_tools.py")
    lab.base_env["NINELIVES_TOOLS"] = "effect_tools"
    store = SQLiteStore(str(lab.root / lab.db))  # the store does not load tools
    for i in range(TASKS):
        store.create_task(f"t{i:02d}", plan_from_dict(PLAN), queue="default")
    store.close()


def _effects(lab: Lab) -> Counter[str]:
    log = lab.root / "effects.log"
    return Counter(log.read_text(encoding="utf-8").split()) if log.exists() else Counter()


def _worker(lab: Lab, *extra: str) -> list[str]:
    return ["worker", "--concurrency", str(TASKS), "--group-commit", "--poll", "0.05", *extra]


def _kill_while_working(lab: Lab, rounds: int, seed: int, *extra: str, **env: str) -> int:
    """Start the worker and SIGKILL it once a seeded number of new steps has run
    its effect; ``rounds`` times. Returns how many kills landed before every step ran.

    The kill points are counts of effects, not moments: a round takes at most
    half its share of the steps still left, so every kill lands while work is
    left however fast or slow the machine is, and the seed replays the schedule.
    With 16 slots at work, where each slot stands at the kill is still left to chance.
    """
    rng = random.Random(seed)
    landed = 0
    for done_rounds in range(rounds):
        ran = len(_effects(lab))
        share = (TASKS * STEPS - ran) // (2 * (rounds - done_rounds))
        target = ran + rng.randint(1, max(1, share))
        # A pause at every crash point stretches each step, so the kills land
        # while every slot is between boundaries.
        proc = lab.spawn(*_worker(lab, *extra), NINELIVES_CRASH_PAUSE="0.02", **env)
        deadline = time.monotonic() + 60  # a hung worker is killed all the same
        while len(_effects(lab)) < target and proc.poll() is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.005)
        if proc.poll() is not None:
            break
        assert lab.kill(proc) == -9
        landed += len(_effects(lab)) < TASKS * STEPS
    return landed


def _over_counted(lab: Lab) -> list[str]:
    """Steps whose effect ran more often than their journal started them, and
    steps that are not done or never ran; empty when the contract held."""
    effects = _effects(lab)
    problems = []
    store = SQLiteStore(str(lab.root / lab.db))
    for i in range(TASKS):
        task_id = f"t{i:02d}"
        task = store.get_task(task_id)
        if task.status.value != "done":
            problems.append(f"{task_id} is {task.status.value}")
        started = Counter(e.step_idx for e in store.events(task_id) if e.kind == "step_started")
        for idx in range(STEPS):
            ran = effects[f"{task_id}-{idx}"]
            if not 1 <= ran <= started[idx]:
                problems.append(f"{task_id} step {idx}: effect ran {ran}x, started {started[idx]}x")
    store.close()
    return problems


@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.parametrize("seed", [13, 14, 15])
def test_sixteen_slots_killed_at_random_lose_no_acknowledged_transition(
    sqlite_lab: Lab, seed: int
) -> None:
    lab = sqlite_lab
    _setup(lab)
    assert _kill_while_working(lab, rounds=5, seed=seed) == 5, "the kills came too late"
    drained = lab.cli(*_worker(lab, "--drain"), timeout=120)
    assert drained.returncode == 0, drained.stderr
    assert "group_commit=2ms" in drained.stderr
    verified = lab.cli("verify", "--all")
    assert verified.returncode == 0, verified
    assert _over_counted(lab) == []


@pytest.mark.crash
@pytest.mark.slow
def test_control_callers_released_before_the_commit_run_effects_the_journal_lost(
    sqlite_lab: Lab,
) -> None:
    """Negative control: the same kills, callers released at once instead of
    after their batch's COMMIT (and a 200 ms linger to widen the window)."""
    lab = sqlite_lab
    _setup(lab)
    path = (lab.root / lab.db).resolve()
    unsafe = {"NINELIVES_TEST_GROUP_EARLY_RELEASE": f"unsafe-test-only:{path}"}
    assert _kill_while_working(lab, 3, 13, "--group-commit-linger-ms", "200", **unsafe) == 3
    drained = lab.cli(*_worker(lab, "--drain"), timeout=120)
    assert drained.returncode == 0, drained.stderr
    assert any("effect ran" in problem for problem in _over_counted(lab))
    # The journal alone looks sound: only the count kept outside the process
    # shows effects that ran under transitions the kill took back.
    assert lab.cli("verify", "--all").returncode == 0


def test_a_fenced_write_fails_alone_and_its_batch_commits(tmp_path: Path) -> None:
    """Four slots' ``start_step`` in one batch, one of them taken over: that one
    raises LeaseLost and journals nothing, the other three commit together."""
    path = str(tmp_path / "state.db")
    setup = SQLiteStore(path)
    plan = plan_from_dict({"goal": "g", "steps": [{"tool": "fetch", "input": {"path": "x"}}]})
    stores = [SQLiteStore(path) for _ in range(4)]
    runs = []
    for i, store in enumerate(stores):
        setup.create_task(f"t{i}", plan)
        runs.append(store.begin_run(f"t{i}", f"r{i}")[0])
    # Another runner takes t1 over: its epoch moves on.
    setup._conn.execute("UPDATE tasks SET lease_epoch = lease_epoch + 1 WHERE id = 't1'")
    group = GroupCommitter(SQLiteStore(path), linger=0.5)
    for store in stores:
        store.join_group(group)
    barrier = threading.Barrier(4)
    outcome: dict[int, object] = {}

    def start(i: int) -> None:
        barrier.wait()
        try:
            outcome[i] = stores[i].start_step(runs[i], 0, "fetch")
        except LeaseLost as exc:
            outcome[i] = exc

    threads = [threading.Thread(target=start, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert isinstance(outcome[1], LeaseLost)
    assert {i: outcome[i] for i in (0, 2, 3)} == {0: 1, 2: 1, 3: 1}
    stats = group.stats()
    assert (stats.batches, stats.writes, stats.failed_writes) == (1, 3, 1)
    for i in range(4):
        kinds = [e.kind for e in setup.events(f"t{i}")]
        assert ("step_started" in kinds) is (i != 1)
    for store in stores:
        store.close()
    group.close()
    setup.close()


def test_an_io_error_in_one_write_fails_its_whole_batch_and_every_later_write(
    tmp_path: Path,
) -> None:
    """An outcome unknown is never one caller's problem: the batch is rolled back,
    each of its writes raises CommitUnknown, and so does any write after it."""
    path = str(tmp_path / "state.db")
    setup = SQLiteStore(path)
    plan = plan_from_dict({"goal": "g", "steps": [{"tool": "fetch", "input": {"path": "x"}}]})
    group = GroupCommitter(SQLiteStore(path), linger=0.5)
    stores = [SQLiteStore(path) for _ in range(2)]
    runs = []
    for i, store in enumerate(stores):
        setup.create_task(f"t{i}", plan)
        runs.append(store.begin_run(f"t{i}", f"r{i}")[0])
        store.join_group(group)
    outcome: dict[int, BaseException | None] = {}

    def good() -> None:
        try:
            stores[0].start_step(runs[0], 0, "fetch")
            outcome[0] = None
        except CommitUnknown as exc:
            outcome[0] = exc

    thread = threading.Thread(target=good)
    thread.start()
    time.sleep(0.1)  # the good write is in the open batch, waiting for the linger
    with pytest.raises(CommitUnknown), stores[1]._write():
        raise sqlite3.OperationalError("disk I/O error")
    thread.join(timeout=30)
    assert isinstance(outcome[0], CommitUnknown)
    with pytest.raises(CommitUnknown):
        stores[0].checkpoint(runs[0], 0, "{}")
    assert [e.kind for e in setup.events("t0")].count("step_started") == 0
    for store in stores:
        store.close()
    group.close()
    setup.close()
