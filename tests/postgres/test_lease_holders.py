"""Two lease rules on PostgreSQL, each once broken:

* A tool that overruns its timeout in a worker slot is journaled through a
  store of its own; that commit renews the lease, and must renew it with the
  worker's ``--lease``, not the default (30 s), or the task stays held long
  after the worker exited.
* ``run TASK`` takes a task over before its lease expires only from a holder
  provably dead. Database sessions also end under a live process
  (``pg_terminate_backend``, ``idle_session_timeout``, a pooler): then ``run``
  must exit 3, never start the step a second time beside the live holder.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from fleet import Fleet, has

from ninelives.plan import plan_from_dict
from ninelives.testing import Lab

pytestmark = [pytest.mark.postgres, pytest.mark.crash]

#: A tool that logs its start and end around a sleep, so overlapping runs show.
NAP_TOOLS = """
import os, time
from ninelives.tools import tool

@tool("nap")
def nap(step_input, ctx, idem_key):
    with open("effects.log", "a") as f:
        f.write(f"start {idem_key} pid={os.getpid()}\\n")
    time.sleep(step_input["sleep"])
    with open("effects.log", "a") as f:
        f.write(f"end {idem_key} pid={os.getpid()}\\n")
    return {"slept": step_input["sleep"]}
"""


@pytest.fixture
def fleet(tmp_path: Path, pg_database: str) -> Iterator[Fleet]:
    lab = Lab(tmp_path / "lab", db=pg_database)
    lab.write("nap_tools.py", NAP_TOOLS)
    lab.base_env["NINELIVES_TOOLS"] = "nap_tools"
    fleet = Fleet(lab)
    yield fleet
    fleet.close()
    lab.reap()


def starts(lab: Lab) -> list[str]:
    log = lab.root / "effects.log"
    lines = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
    return [line for line in lines if line.startswith("start ")]


def lease_left(url: str, task_id: str) -> float:
    """Seconds until the task's lease expires, on the server's clock."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT lease_expires_at - extract(epoch FROM now()) FROM tasks WHERE id = %s",
            (task_id,),
        ).fetchone()
    assert row is not None
    assert row[0] is not None
    return float(row[0])


def test_a_timeout_in_a_slot_keeps_the_workers_lease(fleet: Fleet) -> None:
    plan = {
        "goal": "overrun",
        "steps": [{"tool": "nap", "input": {"sleep": 3}, "timeout": 1, "max_attempts": 2}],
    }
    fleet.store.create_task("t", plan_from_dict(plan), queue="default")
    worker = fleet.start("--lease", "3", "--drain")
    assert worker.wait(60) == 5, worker.log()
    assert "overran its 1s timeout" in worker.log()
    # The overrun's commit renewed the lease: by --lease 3, not by the default 30 s.
    assert lease_left(fleet.lab.db, "t") <= 3.5
    assert [e.kind for e in fleet.events("t")][-1] == "step_error"


def test_run_does_not_take_over_from_a_live_holder_whose_sessions_ended(fleet: Fleet) -> None:
    plan = {"goal": "long", "steps": [{"tool": "nap", "input": {"sleep": 12}}]}
    fleet.store.create_task("t", plan_from_dict(plan), queue="default")
    worker = fleet.start("--lease", "60", "--heartbeat", "20")
    fleet.wait_events("t", has("step_started", 0))
    deadline = time.monotonic() + 30
    while not starts(fleet.lab):
        assert time.monotonic() < deadline, worker.log()
        time.sleep(0.05)
    # End every session of the worker (not ours): its process lives on, inside the tool.
    with psycopg.connect(fleet.lab.db, autocommit=True) as conn:
        ended = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND application_name = 'ninelives'"
        ).fetchall()
    assert ended, "the worker had no session to end"
    fleet.store.close()  # the fixture's own session was among them
    fleet._store = None
    busy = fleet.lab.cli("run", "t")
    assert busy.returncode == 3, busy.stderr
    assert "Traceback" not in busy.stderr
    assert len(starts(fleet.lab)) == 1
    # Nor does doctor call the holder gone (and send the user to `run`).
    doctor = fleet.lab.cli("doctor")
    assert "holding its lease" not in doctor.stdout + doctor.stderr, doctor
    assert worker.proc.poll() is None  # the holder was alive all along
    worker.signal(signal.SIGTERM)
    worker.wait(60)
    assert len(starts(fleet.lab)) == 1
