"""``run TASK`` on PostgreSQL holds the same lease as a worker: exit 3 while a
live holder has it, takeover when the holder is dead, fenced when paused."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest
from fleet import Fleet, expected_artifacts, has, journal_problems

from ninelives.plan import plan_from_dict
from ninelives.testing import Lab
from ninelives.testing.lab import GUIDE_PLAN

pytestmark = [pytest.mark.postgres, pytest.mark.crash]

FAST = ("--lease", "1", "--heartbeat", "0.3", "--poll", "0.05")
SHORT_LEASE = {"NINELIVES_LEASE": "1", "NINELIVES_HEARTBEAT": "0.3"}


@pytest.fixture
def fleet(tmp_path: object, pg_database: str) -> Iterator[Fleet]:
    from pathlib import Path

    lab = Lab(Path(str(tmp_path)) / "lab", db=pg_database)
    lab.guide_setup()
    fleet = Fleet(lab)
    yield fleet
    fleet.close()
    lab.reap()


def submit(fleet: Fleet, task_id: str) -> None:
    fleet.store.create_task(task_id, plan_from_dict(GUIDE_PLAN), queue="default")


def test_run_exits_3_while_a_worker_holds_the_lease(fleet: Fleet) -> None:
    submit(fleet, "t")
    worker = fleet.start(*FAST, AGENT_STEP_DELAY="2")
    fleet.wait_events("t", has("step_started", 0))
    before = fleet.events("t")
    started = time.monotonic()
    busy = fleet.lab.cli("run", "t")
    assert busy.returncode == 3, busy.stderr
    assert time.monotonic() - started < 5
    assert busy.stderr.count("\n") == 1
    assert "Traceback" not in busy.stderr
    assert fleet.events("t") == before
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


def test_run_takes_over_at_once_from_a_sigkilled_worker(fleet: Fleet) -> None:
    submit(fleet, "t")
    worker = fleet.start("--lease", "60", AGENT_STEP_DELAY="30")
    fleet.wait_events("t", has("step_started", 0))
    worker.signal(signal.SIGKILL)
    worker.wait()
    # The lease has a minute left, but its holder's database session is gone.
    result = fleet.lab.cli("run", "t")
    assert result.returncode == 0, result.stderr
    events = fleet.events("t")
    assert [e for e in events if e.kind == "run_started"][-1].data == {"recovered": [0]}
    assert journal_problems(events) == []
    assert fleet.lab.artifacts() == expected_artifacts("t")


def test_a_paused_run_is_fenced_and_exits_3(fleet: Fleet) -> None:
    fleet.store.create_task("t", plan_from_dict(GUIDE_PLAN), queue="default")
    runner = fleet.lab.spawn("run", "t", AGENT_STEP_DELAY="1", **SHORT_LEASE)
    events = fleet.wait_events("t", has("step_started", 1))
    runner.send_signal(signal.SIGSTOP)
    stale = [e.run_id for e in events if e.kind == "run_started"][-1]
    worker = fleet.start(*FAST, "--drain")
    assert worker.wait(60) == 0, worker.log()
    done = [e.seq for e in fleet.events("t") if e.kind == "task_done"]
    runner.send_signal(signal.SIGCONT)
    _, err = runner.communicate(timeout=30)
    assert runner.returncode == 3, err
    assert "taken over" in err
    assert "Traceback" not in err
    events = fleet.events("t")
    assert [e for e in events if e.run_id == stale and e.seq > done[0]] == []
    assert journal_problems(events) == []
    assert fleet.lab.artifacts() == expected_artifacts("t")


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (("run", "t"), {"NINELIVES_LEASE": "soon"}, "NINELIVES_LEASE"),
        (("run", "t"), {"NINELIVES_LEASE": "2", "NINELIVES_HEARTBEAT": "5"}, "heartbeat"),
        (("worker", "--lease", "0"), {}, "lease"),
        (("worker", "--lease", "nan"), {}, "lease"),
        (("worker", "--concurrency", "0"), {}, "concurrency"),
        (("worker", "--poll", "-1"), {}, "poll"),
        (("worker", "--queue", "../x"), {}, "queue"),
        # Empty (a script's unset variable) is checked as given: it drained 'default'.
        (("worker", "--queue", "", "--drain"), {}, "invalid queue name ''"),
        (("submit", "t2", "plan.json", "--queue", "-bad"), {}, "queue"),
    ],
)
def test_bad_lease_and_worker_input_exit_4(
    fleet: Fleet, args: tuple[str, ...], env: dict[str, str], needle: str
) -> None:
    submit(fleet, "t")
    before = fleet.events("t")
    result = fleet.lab.cli(*args, **env)  # type: ignore[arg-type]
    assert result.returncode == 4, result.stderr
    assert result.stderr.startswith("ninelives: error:")
    assert result.stderr.count("\n") == 1
    assert needle in result.stderr
    assert fleet.events("t") == before
    assert fleet.store.task_ids() == ["t"]


def test_an_unreachable_server_is_exit_5_without_the_password(tmp_path: object) -> None:
    from pathlib import Path

    from pgcluster import free_port

    url = f"postgresql://someone:hunter2@127.0.0.1:{free_port()}/nothing"
    lab = Lab(Path(str(tmp_path)) / "lab", db=url)
    for args in (("status", "t"), ("run", "t"), ("worker",)):
        result = lab.cli(*args)
        assert result.returncode == 5, result.stderr
        assert result.stderr.count("\n") == 1
        assert "hunter2" not in result.stderr
        assert "postgresql://someone:***@127.0.0.1" in result.stderr
