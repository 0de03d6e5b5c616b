"""``ninelives approve`` (and ``resolve``) from the command line: what it keeps of
a note, and what it says comes next for a task in a queue."""

from __future__ import annotations

from errorlines import one_line
from ninelives.testing import Lab

PLAN = {
    "goal": "g",
    "steps": [
        {"tool": "approval", "input": {"prompt": "ok?"}},
        {"tool": "fetch", "input": {"path": "input/a.txt"}},
    ],
}


def _waiting(lab: Lab, task_id: str, *queue: str) -> None:
    """Task ``task_id`` of :data:`PLAN`, parked at its approval step 0 (by a
    worker of ``queue`` when given, else by ``run``)."""
    lab.write("input/a.txt", "hello")
    lab.write_plan(PLAN)
    if queue:
        assert lab.cli("create", task_id, "plan.json", "--queue", *queue).returncode == 0
        assert lab.cli("worker", "--queue", *queue, "--drain", "--poll", "0.1").returncode == 0
    else:
        assert lab.cli("create", task_id, "plan.json").returncode == 0
        assert lab.cli("run", task_id).returncode == 8
    assert lab.cli("status", task_id).json()["status"] == "waiting"


def test_a_note_is_bounded_as_a_cancel_reason_is(lab: Lab) -> None:
    # A note of any size (up to one argv argument) went into the journal, and a
    # rejection's note became the task's reason, while cancel --reason is
    # bounded: the same limit now, the same one line, exit 4, nothing stored.
    _waiting(lab, "t")
    before = lab.fingerprint("t")
    for decision in ((), ("--reject",)):
        refused = lab.cli("approve", "t", "0", *decision, "--note", "n" * 1001)
        one_line(refused, 4, "--note must be at most 1000 characters")
        assert lab.fingerprint("t") == before
    cancel = one_line(lab.cli("cancel", "t", "--reason", "n" * 1001), 4)
    assert cancel.replace("--reason", "--note") in refused.stderr
    assert lab.fingerprint("t") == before
    # The control: a note at the limit is kept whole.
    assert lab.cli("approve", "t", "0", "--note", "n" * 1000).returncode == 0
    approved = [e for e in lab.cli("export", "t").jsonl() if e["kind"] == "step_approved"]
    assert [e["note"] for e in approved] == ["n" * 1000]


def test_approving_a_queued_task_says_a_worker_of_its_queue_picks_it_up(lab: Lab) -> None:
    # A task of a queue is run by the workers of that queue: "'ninelives run q'
    # resumes it" sent its user to run it by hand beside them.
    _waiting(lab, "q", "jobs")
    approved = lab.cli("approve", "q", "0")
    assert approved.returncode == 0, approved
    assert "a worker of queue 'jobs' picks it up" in approved.stdout, approved.stdout
    assert "ninelives run" not in approved.stdout, approved.stdout
    assert lab.cli("worker", "--queue", "jobs", "--drain", "--poll", "0.1").returncode == 0
    assert lab.cli("status", "q").json()["status"] == "done"
    # The control: a task in no queue is resumed by run.
    _waiting(lab, "t")
    alone = lab.cli("approve", "t", "0")
    assert alone.returncode == 0, alone
    assert "'ninelives run t' resumes it" in alone.stdout, alone.stdout


def test_resolving_a_queued_task_says_a_worker_of_its_queue_picks_it_up(lab: Lab) -> None:
    # As approve did: "'ninelives run q' resumes it" for a task the workers claim.
    lab.guide_setup()
    fetch = {"tool": "fetch", "input": {"path": "input/notes.txt"}, "on_unknown": "refuse"}
    lab.write_plan({"goal": "g", "steps": [fetch]})
    assert lab.cli("create", "q", "plan.json", "--queue", "jobs").returncode == 0
    drain = ("worker", "--queue", "jobs", "--drain", "--poll", "0.1")
    assert lab.cli(*drain, AGENT_CRASH_AT="after_effect:0").returncode == -9
    assert lab.cli(*drain).returncode == 0  # the step is found running: blocked
    assert lab.cli("status", "q").json()["status"] == "blocked"
    resolved = lab.cli("resolve", "q", "0", "--retry")
    assert resolved.returncode == 0, resolved
    assert "a worker of queue 'jobs' picks it up" in resolved.stdout, resolved.stdout
    assert "ninelives run" not in resolved.stdout, resolved.stdout
    assert lab.cli(*drain).returncode == 0
    assert lab.cli("status", "q").json()["status"] == "done"
