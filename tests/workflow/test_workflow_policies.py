"""A workflow's step errors and policies through the command line, real
processes: retries by max_attempts, a failed task resumed by retry at the
failed step, PermanentError, timeout, outputs and results that JSON cannot
hold, StepFailed caught by the workflow, code that raises between steps, a
checkpoint carried to the next attempt, sys.exit in a step or between steps."""

from __future__ import annotations

import pytest

from ninelives.testing import Lab

pytestmark = pytest.mark.crash

FLOWS = """
import asyncio
import os
import sys
import time

import ninelives


def log(line):
    with open("calls.log", "a") as f:
        f.write(line + "\\n")


def flaky(n):
    step = ninelives.current_step()
    log(f"flaky {step.attempt}")
    if step.attempt < n:
        raise RuntimeError(f"attempt {step.attempt} fails")
    return step.attempt


@ninelives.step(max_attempts=2, backoff=False)
def broken():
    log("broken")
    if not os.path.exists("fixed"):
        raise RuntimeError("the service is down")
    return "fixed"


@ninelives.step(max_attempts=5)
def refused():
    log("refused")
    raise ninelives.PermanentError("404: no such ticket")


@ninelives.step(timeout=0.2, max_attempts=1)
def slow():
    time.sleep(30)


@ninelives.step(on_unknown="refuse")
def charge(n):
    log(f"charge {n}")
    return {"charged": n}


@ninelives.workflow
def pay(ctx, n):
    return {"got": charge(n)}


@ninelives.workflow
def retrying(ctx):
    first = ctx.step("first", log, "first")
    return {"attempt": ctx.step("flaky", flaky, 3), "first": first}


@ninelives.workflow
def fails(ctx):
    ctx.step("first", log, "first")
    return {"got": broken()}


@ninelives.workflow
def permanent(ctx):
    return refused()


@ninelives.workflow
def overruns(ctx):
    return slow()


@ninelives.workflow
def opaque(ctx):
    return ctx.step("opaque", object)


@ninelives.workflow
def bad_result(ctx):
    ctx.step("first", log, "first")
    return {"when": object()}


@ninelives.workflow
def catches(ctx):
    try:
        broken()
    except ninelives.StepFailed:
        return {"caught": True}


@ninelives.workflow
def raises(ctx):
    ctx.step("first", log, "first")
    raise KeyError("no such field")


@ninelives.workflow
def raises_long(ctx):
    ctx.step("first", log, "first")
    raise ValueError("page: " + "z" * 100_000)


@ninelives.step(max_attempts=3, backoff=False)
def chunks(n):
    step = ninelives.current_step()
    done = step.progress or {"next": 0}
    for i in range(done["next"], n):
        log(f"chunk {i}")
        step.checkpoint({"next": i + 1})
        if i == 1 and step.attempt == 1:
            raise RuntimeError("the connection dropped")
    return n


@ninelives.workflow
def chunked(ctx, n):
    return chunks(n)


@ninelives.workflow
async def achunked(ctx, n):
    await asyncio.sleep(0)
    return await chunks(n)


@ninelives.step(max_attempts=2, backoff=False)
def exiting():
    log("exiting")
    sys.exit(0)


@ninelives.workflow
def exits_in_a_step(ctx):
    return exiting()


@ninelives.workflow
def exits_between_steps(ctx):
    ctx.step("first", log, "first")
    sys.exit(0)
"""


@pytest.fixture
def flow_lab(lab: Lab) -> Lab:
    lab.write("pflows.py", FLOWS)
    lab.base_env["NINELIVES_TOOLS"] = "pflows"
    lab.base_env["NINELIVES_BACKOFF"] = "0"
    return lab


def _calls(lab: Lab) -> list[str]:
    log = lab.root / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def _error_lines(stderr: str) -> int:
    return sum(line.startswith("ninelives: error:") for line in stderr.splitlines())


def _kinds(lab: Lab, task: str) -> list[tuple[str, int | None]]:
    return [(e["kind"], e["step"]) for e in lab.cli("export", task).jsonl()]


def test_a_step_is_retried_by_its_policy(flow_lab: Lab) -> None:
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "retrying").returncode == 0
    done = lab.cli("run", "t")
    assert done.returncode == 0, done.stderr
    status = lab.cli("status", "t", "--json").json()
    assert status["result"] == {"attempt": 3, "first": None}
    assert status["steps"][1]["attempts"] == 3
    errors = [e for e in lab.cli("export", "t").jsonl() if e["kind"] == "step_error"]
    assert [e["error"] for e in errors] == [
        "RuntimeError: attempt 1 fails",
        "RuntimeError: attempt 2 fails",
    ]


def test_a_failed_task_is_resumed_by_retry_at_the_failed_step(flow_lab: Lab) -> None:
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "fails").returncode == 0
    failed = lab.cli("run", "t")
    assert failed.returncode == 2
    assert "the service is down" in failed.stderr.splitlines()[-1]
    assert lab.cli("status", "t", "--json").json()["status"] == "failed"
    assert lab.cli("run", "t").returncode == 2  # failed stays failed until retry
    assert _calls(lab) == ["first", "broken", "broken"]
    (lab.root / "fixed").write_text("")
    assert lab.cli("retry", "t").returncode == 0
    done = lab.cli("run", "t")
    assert done.returncode == 0, done.stderr
    assert _calls(lab) == ["first", "broken", "broken", "broken"]  # step 0 not run again
    assert lab.cli("status", "t", "--json").json()["result"] == {"got": "fixed"}
    assert lab.cli("verify", "t").returncode == 0


def test_a_permanent_error_fails_at_once(flow_lab: Lab) -> None:
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "permanent").returncode == 0
    failed = lab.cli("run", "t")
    assert failed.returncode == 2
    assert "404: no such ticket" in failed.stderr
    assert _calls(lab) == ["refused"]


def test_a_step_over_its_timeout_is_a_step_error(flow_lab: Lab) -> None:
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "overruns").returncode == 0
    failed = lab.cli("run", "t")
    assert failed.returncode == 2
    errors = [e for e in lab.cli("export", "t").jsonl() if e["kind"] == "step_error"]
    assert errors[0]["error"] == "timeout after 0.2s", errors


def test_an_output_json_cannot_hold_is_a_step_error_naming_the_step(flow_lab: Lab) -> None:
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "opaque").returncode == 0
    failed = lab.cli("run", "t", AGENT_MAX_ATTEMPTS="1")
    assert failed.returncode == 2
    assert "Traceback" not in failed.stderr
    assert "step 0 (opaque)" in failed.stderr.splitlines()[-1]
    assert "not standard JSON" in failed.stderr.splitlines()[-1]


def test_a_result_json_cannot_hold_is_refused_and_nothing_is_written(flow_lab: Lab) -> None:
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "bad_result").returncode == 0
    refused = lab.cli("run", "t")
    assert refused.returncode == 12
    assert _error_lines(refused.stderr) == 1
    assert "return value cannot be stored" in refused.stderr
    assert lab.cli("status", "t", "--json").json()["status"] == "running"
    assert ("task_done", None) not in _kinds(lab, "t")


def test_a_workflow_that_catches_step_failed_still_fails(flow_lab: Lab) -> None:
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "catches").returncode == 0
    failed = lab.cli("run", "t")
    assert failed.returncode == 2, failed.stderr
    status = lab.cli("status", "t", "--json").json()
    assert status["status"] == "failed"
    assert "result" not in status


def test_code_that_raises_between_steps_stops_with_one_line(flow_lab: Lab) -> None:
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "raises").returncode == 0
    stopped = lab.cli("run", "t")
    assert stopped.returncode == 12
    assert _error_lines(stopped.stderr) == 1
    assert "Traceback" not in stopped.stderr
    assert "KeyError" in stopped.stderr
    assert "after 1 step call(s)" in stopped.stderr
    assert lab.cli("status", "t", "--json").json()["status"] == "running"


def test_a_long_error_between_steps_is_cut_as_a_steps_is(flow_lab: Lab) -> None:
    # All of a 100 000-character message went onto the run's one error line
    # (and each replay-check line), where a step's error is cut at 2000.
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "raises_long").returncode == 0
    for args in (("run", "t"), ("replay-check", "t")):
        stopped = lab.cli(*args)
        assert stopped.returncode in (12, 7), stopped.returncode
        assert "ValueError: page: zzz" in stopped.stderr + stopped.stdout
        assert len(stopped.stderr + stopped.stdout) < 3000, args


def test_bad_arguments_are_refused_at_create_and_nothing_is_stored(flow_lab: Lab) -> None:
    lab = flow_lab
    lab.cli("create", "seed", "--workflow", "retrying")
    plan = str(lab.guide_setup())
    before = lab.fingerprint("seed")
    for args in (
        ["--workflow", "nope"],
        ["--workflow", "retrying", "--args", "[1]"],  # takes no argument
        ["--workflow", "retrying", "--args", "[NaN]"],
        ["--workflow", "retrying", "--args", "[1e999]"],
        ["--workflow", "retrying", "--args", "{"],
        ["--workflow", "retrying", "--args", "3"],
        ["--workflow", "retrying", "--args", "[" * 40 + "]" * 40],
        ["--workflow", "retrying", "--args", '["\\ud800"]'],
        ["--workflow", "retrying", plan],
        ["--args", "[]"],
    ):
        refused = lab.cli("create", "x", *args)
        assert refused.returncode == 4, (args, refused.stderr)
        assert len(refused.stderr.strip().splitlines()) == 1, (args, refused.stderr)
        assert lab.fingerprint("seed") == before, args


def test_a_run_without_the_workflow_module_is_refused_before_the_claim(flow_lab: Lab) -> None:
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "retrying").returncode == 0
    before = lab.fingerprint("t")
    refused = lab.cli("run", "t", NINELIVES_TOOLS="")
    assert refused.returncode == 4
    assert "unknown workflow 'retrying'" in refused.stderr
    assert "nothing written" in refused.stderr
    after = lab.fingerprint("t")
    after["files"] = {k: v for k, v in after["files"].items() if ".locks" not in k}
    assert after == before


@pytest.mark.parametrize("decision", ["--done", "--retry"])
def test_a_refuse_step_left_running_blocks_until_resolved(flow_lab: Lab, decision: str) -> None:
    lab = flow_lab
    assert lab.cli("create", "p", "--workflow", "pay", "--args", "[5]").returncode == 0
    assert lab.cli("run", "p", AGENT_CRASH_AT="after_effect:0").returncode == -9
    blocked = lab.cli("run", "p")
    assert blocked.returncode == 8
    assert "ninelives resolve p 0" in blocked.stderr
    given = ["--done", '{"value": {"charged": 5}}'] if decision == "--done" else ["--retry"]
    assert lab.cli("resolve", "p", "0", *given).returncode == 0
    done = lab.cli("run", "p")
    assert done.returncode == 0, done.stderr
    assert lab.cli("status", "p", "--json").json()["result"] == {"got": {"charged": 5}}
    ran = 1 if decision == "--done" else 2
    assert _calls(lab) == ["charge 5"] * ran  # resolved done: not called again
    assert lab.cli("verify", "p").returncode == 0


@pytest.mark.parametrize("flow", ["chunked", "achunked"])
def test_the_next_attempt_of_a_step_resumes_from_its_last_checkpoint(
    flow_lab: Lab, flow: str
) -> None:
    """An attempt that raised after committing two chunks: the next attempt in the
    same run starts from that checkpoint, as a plan step's does."""
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", flow, "--args", "[4]").returncode == 0
    done = lab.cli("run", "t")
    assert done.returncode == 0, done.stderr
    assert _calls(lab) == ["chunk 0", "chunk 1", "chunk 2", "chunk 3"]
    task = lab.cli("status", "t", "--json").json()
    assert task["result"] == 4
    assert task["steps"][0]["attempts"] == 2
    assert lab.cli("verify", "t").returncode == 0


def test_sys_exit_in_a_step_is_a_step_error_not_the_exit_code(flow_lab: Lab) -> None:
    """sys.exit(0) in a step (a library's CLI helper, say) made run exit 0, the
    code of a done task, with the step left running and nothing said."""
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "exits_in_a_step").returncode == 0
    failed = lab.cli("run", "t")
    assert failed.returncode == 2, failed.stderr
    assert _error_lines(failed.stderr) == 1
    assert "SystemExit" in failed.stderr
    assert _calls(lab) == ["exiting", "exiting"]
    assert lab.cli("status", "t", "--json").json()["status"] == "failed"
    assert lab.cli("verify", "t").returncode == 0


def test_sys_exit_between_steps_stops_with_one_line_and_replay_check_reports_it(
    flow_lab: Lab,
) -> None:
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "exits_between_steps").returncode == 0
    stopped = lab.cli("run", "t")
    assert stopped.returncode == 12, stopped.stderr
    assert _error_lines(stopped.stderr) == 1
    assert "SystemExit" in stopped.stderr
    assert lab.cli("status", "t", "--json").json()["status"] != "done"
    checked = lab.cli("replay-check", "--all")  # every run of this code stops so
    assert checked.returncode == 7, checked.stderr
    assert checked.stdout.startswith("t: cannot be replayed here: ")
    assert "SystemExit" in checked.stdout
    assert "1 of 1 workflow task(s) diverge or cannot be replayed here" in checked.stderr


ASYNC_PROBES = """
import asyncio

import ninelives


async def aprobe(ctx):
    await asyncio.sleep(0)
    return {"asked": ctx.idem_key}


def post(text):
    with open("calls.log", "a") as f:
        f.write("post\\n")
    return {"posted": text}


DECLARED = "DECLARED"
if DECLARED == "async":
    posted = ninelives.step(name="post", on_unknown="probe", probe=aprobe)(post)
else:  # a plain callable that hands back the coroutine, unawaited
    posted = ninelives.step(name="post", on_unknown="probe", probe=lambda ctx: aprobe(ctx))(post)


@ninelives.workflow
async def probed(ctx):
    return await posted("hi")
"""


def test_an_async_probe_is_refused_where_it_is_declared(lab: Lab) -> None:
    """A workflow step's probe is asked outside the event loop, so an ``async def``
    probe never ran: after a kill its coroutine was stored as its answer, the step
    blocked ("Object of type coroutine is not JSON serializable") and Python's
    "never awaited" warnings reached stderr. The module defining one is refused."""
    lab.write("aprobes.py", ASYNC_PROBES.replace('"DECLARED"', '"async"'))
    refused = lab.cli("--tools", "aprobes", "create", "t", "--workflow", "probed")
    assert refused.returncode == 4, refused.stderr
    assert _error_lines(refused.stderr) == 1
    assert "must be a plain def, not an async def" in refused.stderr
    assert lab.cli("status", "t").returncode == 1  # nothing stored


def test_a_probe_that_returns_a_coroutine_blocks_the_step_in_one_line(lab: Lab) -> None:
    lab.write("aprobes.py", ASYNC_PROBES.replace('"DECLARED"', '"lambda"'))
    lab.base_env["NINELIVES_TOOLS"] = "aprobes"
    assert lab.cli("create", "t", "--workflow", "probed").returncode == 0
    assert lab.cli("run", "t", AGENT_CRASH_AT="after_effect:0").returncode == -9
    blocked = lab.cli("run", "t")
    assert blocked.returncode == 8, blocked.stderr
    assert "RuntimeWarning" not in blocked.stderr
    assert _error_lines(blocked.stderr) == 1
    assert "the probe returned an awaitable" in blocked.stderr
    assert lab.cli("status", "t", "--json").json()["status"] == "blocked"
    assert lab.cli("verify", "t").returncode == 0


RAISING_PROBE = """
import os

import ninelives


def probe(ctx):
    if os.environ.get("PROBE") == "surrogate":
        raise ValueError("lookup of caf\\udce9 failed")  # a name read with surrogateescape
    raise ValueError("y" * 100_000)


@ninelives.step(name="post", on_unknown="probe", probe=probe)
def post():
    return {"posted": True}


@ninelives.workflow
def probed(ctx):
    return post()
"""


@pytest.mark.parametrize("probe", ["surrogate", "long"])
def test_a_probe_that_raises_blocks_the_step_with_its_error_as_a_plans_does(
    lab: Lab, probe: str
) -> None:
    """A workflow step's probe raising with a lone surrogate in its message stopped
    every run with exit 12, "raised outside a step: UnicodeEncodeError", the step
    left running; with a long message, all of it went into the journal and onto
    stderr. Its reason is kept as a plan's probe's is: escaped, at most 2000 characters."""
    lab.write("rprobes.py", RAISING_PROBE)
    lab.base_env["NINELIVES_TOOLS"] = "rprobes"
    assert lab.cli("create", "t", "--workflow", "probed").returncode == 0
    assert lab.cli("run", "t", AGENT_CRASH_AT="after_effect:0").returncode == -9
    blocked = lab.cli("run", "t", PROBE=probe)
    assert blocked.returncode == 8, blocked.stderr
    assert _error_lines(blocked.stderr) == 1
    assert "the probe raised ValueError" in blocked.stderr
    assert len(blocked.stderr) < 3000, len(blocked.stderr)
    assert lab.cli("status", "t", "--json").json()["status"] == "blocked"
    exported = lab.cli("export", "t")
    assert exported.returncode == 0, exported.stderr
    assert len(exported.stdout) < 6000, len(exported.stdout)
    assert lab.cli("verify", "t").returncode == 0
