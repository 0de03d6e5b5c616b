"""Where durable code meets Python's edges, through the command line, real
processes: dict keys JSON turns into text, a step function's own ``name`` and
``fn`` keywords, a step policy changed in the code under a started step, verify
after a retry, steps started together by ``asyncio.gather``, an exception whose
message itself raises."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import ninelives
from ninelives.errors import InputError
from ninelives.lineage import check_plan
from ninelives.testing import Lab, Result

pytestmark = pytest.mark.crash

FLOWS = """
import asyncio
import os

import ninelives


def log(line):
    with open("calls.log", "a") as f:
        f.write(line + "\\n")


def lookup():
    return {1: "one"}


@ninelives.workflow
def int_keys(ctx):
    table = ctx.step("lookup", lookup)
    return {"first": table[1]}


@ninelives.workflow
def int_result(ctx):
    ctx.step("first", log, "first")
    return {1: "one"}


@ninelives.step
def greet(name):
    return "hello " + name


def label(fn, name):
    return f"{fn}/{name}"


@ninelives.workflow
def keywords(ctx):
    return {"greet": greet(name="bob"), "label": ctx.step("label", label, fn="f", name="n")}


@ninelives.step(max_attempts=MAX, backoff=False)
def call_api():
    log("call_api")
    raise RuntimeError("api down")


@ninelives.workflow
def calls_api(ctx):
    return call_api()


@ninelives.step(max_attempts=1)
async def boom():
    await asyncio.sleep(0.2)
    raise RuntimeError("boom")


async def slow():
    log("slow")
    await asyncio.sleep(2)
    return "slow"


@ninelives.workflow
async def together(ctx):
    return await asyncio.gather(boom(), ctx.step("slow", slow))


@ninelives.workflow
async def cut_short(ctx):
    try:
        await asyncio.wait_for(ctx.step("slow", slow), 0.1)
    except asyncio.TimeoutError:
        pass
    return await ctx.step("next", log, "next")


@ninelives.workflow
async def unawaited(ctx):
    asyncio.ensure_future(ctx.step("slow", slow))
    await asyncio.sleep(0.1)
    return "returned"


async def later():
    log("later")
    return "later"


@ninelives.step(name="declared_later")
async def declared_later():
    log("later")
    return "later"


@ninelives.workflow
def sync_calls_async(ctx, declared):
    ctx.step("first", log, "first")
    return declared_later() if declared else ctx.step("later", later)


def cancels():
    log("cancels")
    raise asyncio.CancelledError()


async def acancels():
    log("cancels")
    raise asyncio.CancelledError()


@ninelives.workflow
def sync_cancel(ctx):
    return ctx.step("cancels", cancels)


@ninelives.workflow
async def self_cancel(ctx):
    return await ctx.step("cancels", acancels)


@ninelives.workflow
def cancel_between(ctx):
    ctx.step("first", log, "first")
    raise asyncio.CancelledError()


@ninelives.workflow
def nested(ctx):
    def outer():
        log("outer")
        return ctx.step("inner", log, "inner")

    return ctx.step("outer", outer)


class ApiError(Exception):
    def __init__(self, response):
        super().__init__()
        self.response = response

    def __str__(self):
        return self.response["message"]


@ninelives.step(max_attempts=3, backoff=False)
def unprintable():
    log("unprintable")
    raise ApiError({})


@ninelives.workflow
def raises_unprintable_in_a_step(ctx):
    return unprintable()


@ninelives.workflow
def raises_unprintable(ctx):
    ctx.step("one", log, "one")
    raise ApiError({})


def pay(name):
    key = ninelives.current_step().idem_key
    with open("effects.log", "a") as f:
        f.write(f"{name} {key}\\n")
        f.flush()
        os.fsync(f.fileno())
    return name


def owed():
    return {"zeta": 10, "alpha": 20}


@ninelives.workflow
def pay_all(ctx):
    return [ctx.step("pay", pay, name) for name in ctx.step("owed", owed)]


@ninelives.workflow
def uncallable(ctx):
    ctx.step("first", log, "first")
    return ctx.step("second", "log", "second")


@ninelives.workflow
async def auncallable(ctx):
    await ctx.step("first", log, "first")
    return await ctx.step("second", None)


@ninelives.workflow
def odd_name(ctx, kind):
    ctx.step("first", log, "first")
    return ctx.step({"nul": "a\\x00b", "surrogate": "a\\udcffb"}[kind], log, "second")
"""


def write_flows(lab: Lab, max_attempts: int = 2) -> None:
    # A comment of another length each time: a rewrite within the same second
    # must not be served from a stale .pyc.
    lab.write("eflows.py", f"# attempts {max_attempts}\n" + FLOWS.replace("MAX", str(max_attempts)))


@pytest.fixture
def flow_lab(lab: Lab) -> Lab:
    write_flows(lab)
    lab.base_env["NINELIVES_TOOLS"] = "eflows"
    lab.base_env["PYTHONDONTWRITEBYTECODE"] = "1"
    return lab


def _calls(lab: Lab) -> list[str]:
    log = lab.root / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def _one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("ninelives: error:")]
    assert len(errors) == 1, stderr
    return errors[0]


def _stopped(lab: Lab, *create: str) -> tuple[Result, dict[str, Any]]:
    """Create task ``t`` with ``create``'s arguments and run it: exit 12, the
    workflow's code cannot carry it on. The run's result and the task's status."""
    made = lab.cli("create", "t", *create)
    assert made.returncode == 0, made.stderr
    refused = lab.cli("run", "t")
    assert refused.returncode == 12, refused.stderr
    return refused, lab.cli("status", "t", "--json").json()


def test_a_step_value_with_a_key_json_would_turn_into_text_is_a_step_error(
    flow_lab: Lab,
) -> None:
    """{1: "one"} would read back as {"1": "one"}: a resumed task would find
    another value than the first run had, so it is refused like any value JSON
    cannot hold, on the first run."""
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "int_keys").returncode == 0
    failed = lab.cli("run", "t", AGENT_MAX_ATTEMPTS="1")
    assert failed.returncode == 2, failed.stderr
    line = _one_error_line(failed.stderr)
    assert "step 0 (lookup)" in line, line
    assert "key 1 is not a string" in line, line


def test_a_result_with_a_key_json_would_turn_into_text_is_refused(flow_lab: Lab) -> None:
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "int_result").returncode == 0
    refused = lab.cli("run", "t")
    assert refused.returncode == 12, refused.stderr
    assert "key 1 is not a string" in _one_error_line(refused.stderr)
    assert lab.cli("status", "t", "--json").json()["status"] == "running"


def test_arguments_with_a_key_json_would_turn_into_text_are_refused(tmp_path: Path) -> None:
    @ninelives.workflow("edges_show_keys")
    def show(ctx: object, table: dict[object, str]) -> list[str]:
        return sorted(repr(k) for k in table)

    with ninelives.open(str(tmp_path / "state.db")) as rt:
        with pytest.raises(InputError, match="key 1 is not a string"):
            rt.create("a", show, {1: "one"})
        assert rt.store.task_ids() == []


@pytest.mark.parametrize("kind", ["nul", "surrogate"])
def test_a_step_name_that_cannot_be_stored_is_refused_before_it_runs(
    flow_lab: Lab, kind: str
) -> None:
    """A NUL (or a lone surrogate) in a step's name: SQLite kept the NUL, PostgreSQL
    refused it as a store error (exit 5) with the step about to run. Refused on
    both as a plan's NUL is, before the step: exit 12, the task left to fixed code."""
    lab = flow_lab
    made = lab.cli("create", "t", "--workflow", "odd_name", "--args", f'["{kind}"]')
    assert made.returncode == 0, made.stderr
    refused = lab.cli("run", "t")
    assert refused.returncode == 12, refused.stderr
    assert "cannot be stored as text" in _one_error_line(refused.stderr)
    assert _calls(lab) == ["first"]
    status = lab.cli("status", "t", "--json").json()
    assert [s["tool"] for s in status["steps"]] == ["first"]
    assert status["status"] == "running"


BAD_VERSION = """
import ninelives


@ninelives.workflow("bad_version", version="v\\udcff")
def bad_version(ctx):
    return 1
"""


def test_a_workflow_version_that_is_not_valid_unicode_is_refused(
    flow_lab: Lab, tmp_path: Path
) -> None:
    """A lone surrogate in a workflow's version (or a hand-made Workflow's name)
    cannot be stored as text: ``create`` printed a UnicodeEncodeError traceback
    (exit 1, "unknown task"), the library raised it bare."""
    lab = flow_lab
    lab.write("vflows.py", BAD_VERSION)
    refused = lab.cli("create", "t", "--workflow", "bad_version", NINELIVES_TOOLS="vflows")
    assert refused.returncode == 4, refused.stderr
    assert "not valid Unicode" in _one_error_line(refused.stderr)
    assert lab.cli("status", "t").returncode == 1

    def body(ctx: Any) -> int:
        return 1

    with pytest.raises(InputError, match="not valid Unicode"):
        ninelives.workflow("edges_bad_version", version="v\udcff")(body)
    assert "edges_bad_version" not in ninelives.durable.registered()
    for hand in (
        ninelives.durable.Workflow(name="edges_hand", fn=body, version="v\udcff"),
        ninelives.durable.Workflow(name="edges_\udcff", fn=body),
    ):
        with ninelives.open(str(tmp_path / "state.db")) as rt:
            with pytest.raises(InputError, match="not valid Unicode"):
                rt.create("a", hand)
            assert rt.store.task_ids() == []


def test_keys_mixing_text_and_numbers_are_named_as_such(tmp_path: Path) -> None:
    """Sorting {1: .., "x": ..} fails before JSON sees the key: the error named
    no key ("'<' not supported between instances of 'str' and 'int'")."""

    @ninelives.workflow("edges_mixed_keys")
    def mixed(ctx: Any, table: dict[Any, str]) -> Any:
        return ctx.step("lookup", lambda: {"codes": {200: "ok", "default": "?"}})

    with ninelives.open(str(tmp_path / "state.db")) as rt:
        with pytest.raises(InputError, match="key 1 is not a string"):
            rt.create("a", mixed, {1: "one", "x": "two"})
        assert rt.store.task_ids() == []
        rt.create("b", mixed, {"x": "two"})
        with pytest.raises(ninelives.TaskFailed) as failed:
            rt.run("b")
    assert "step 0 (lookup)" in str(failed.value)
    assert "key 200 is not a string" in str(failed.value)


def test_step_arguments_larger_than_a_plan_are_passed_but_not_stored(tmp_path: Path) -> None:
    """A step called in a loop with a large value would store it on every call:
    past a plan's size its arguments are recorded as ``{}``, as for arguments JSON
    cannot hold; the function still gets them, and smaller ones are kept."""
    from ninelives.plan import MAX_PLAN_BYTES

    @ninelives.workflow("edges_big_args")
    def measure(ctx: Any, size: int) -> list[int]:
        return [ctx.step("len", len, "x" * n) for n in (size, size + 1)]

    db = tmp_path / "state.db"
    size = MAX_PLAN_BYTES - len('{"args":[""],"kwargs":{}}')  # the largest stored whole
    with ninelives.open(str(db)) as rt:
        rt.create("t", measure, size)
        assert rt.run("t").status.value == "done"
        assert rt.result("t") == [size, size + 1]
        task = rt.status("t")
        check_plan(task)  # the digest covers what was stored, {} included
        inputs = [s.input for s in task.steps]
    assert inputs[0] == {"args": ["x" * size], "kwargs": {}}
    assert inputs[1] == {}
    assert db.stat().st_size < 4 * MAX_PLAN_BYTES  # one copy kept, not two


@pytest.mark.parametrize("point", [None, "after_commit:1"])
def test_code_looping_over_a_dict_a_step_returned_runs_the_same_after_a_kill(
    flow_lab: Lab, point: str | None
) -> None:
    """The journal keeps a value's keys sorted: the first run must loop over them in
    the order a replay will, or a kill between two payments pays one twice (under
    two keys) and the other never."""
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "pay_all").returncode == 0
    if point is not None:
        assert lab.cli("run", "t", AGENT_CRASH_AT=point).returncode == -9
    done = lab.cli("run", "t")
    assert done.returncode == 0, done.stderr
    assert (lab.root / "effects.log").read_text().splitlines() == ["alpha t-1", "zeta t-2"]
    assert lab.cli("status", "t", "--json").json()["result"] == ["alpha", "zeta"]
    assert lab.cli("verify", "t").returncode == 0


def test_a_step_function_may_take_keywords_named_name_and_fn(flow_lab: Lab) -> None:
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "keywords").returncode == 0
    done = lab.cli("run", "t")
    assert done.returncode == 0, done.stderr
    assert lab.cli("status", "t", "--json").json()["result"] == {
        "greet": "hello bob",
        "label": "f/n",
    }


def test_a_started_step_keeps_the_policy_it_was_stored_with(flow_lab: Lab) -> None:
    """The code raises max_attempts from 2 to 4 under a started step: the run and
    verify both hold to the stored 2 (steps started later take the new policy)."""
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "calls_api").returncode == 0
    killed = lab.cli("run", "t", AGENT_CRASH_AT="before_effect:0")
    assert killed.returncode == -9, killed.stderr
    write_flows(lab, max_attempts=4)
    failed = lab.cli("run", "t")
    assert failed.returncode == 2, failed.stderr
    assert _calls(lab) == ["call_api"]  # attempt 2 of 2: the killed one was attempt 1
    checked = lab.cli("verify", "t")
    assert checked.returncode == 0, checked.stdout


def test_verify_counts_a_steps_attempts_from_its_last_retry(flow_lab: Lab) -> None:
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "calls_api").returncode == 0
    assert lab.cli("run", "t").returncode == 2
    assert lab.cli("retry", "t").returncode == 0
    assert lab.cli("run", "t").returncode == 2
    assert _calls(lab) == ["call_api"] * 4  # 2 attempts, a retry, 2 attempts
    checked = lab.cli("verify", "t")
    assert checked.returncode == 0, checked.stdout


def test_steps_started_together_are_refused_before_the_second_starts(flow_lab: Lab) -> None:
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "together").returncode == 0
    refused = lab.cli("run", "t")
    assert refused.returncode == 12, refused.stderr
    assert "steps run one after another" in _one_error_line(refused.stderr)
    assert "slow" not in _calls(lab)
    status = lab.cli("status", "t", "--json").json()
    assert status["status"] == "running"
    assert [s["tool"] for s in status["steps"]] == ["boom"]
    checked = lab.cli("verify", "t")
    assert checked.returncode == 0, checked.stdout


@pytest.mark.parametrize("flow", ["cut_short", "unawaited"])
def test_a_step_cancelled_while_it_runs_stops_the_run(flow_lab: Lab, flow: str) -> None:
    """``asyncio.wait_for`` around a step, or a workflow returning before the
    step it started ends, cancels the step mid-effect: its outcome is unknown,
    as after a kill. The run went on (the next step, then ``task_done``) with
    the step left ``running`` in a done task, which verify reported."""
    lab = flow_lab
    refused, status = _stopped(lab, "--workflow", flow)
    assert "was cancelled while it ran" in _one_error_line(refused.stderr)
    assert _calls(lab) == ["slow"]
    assert status["status"] == "running"
    assert [(s["tool"], s["status"]) for s in status["steps"]] == [("slow", "running")]
    checked = lab.cli("verify", "t")
    assert checked.returncode == 0, checked.stdout


@pytest.mark.parametrize("flow", ["sync_cancel", "self_cancel"])
def test_a_step_raising_asyncios_cancel_stops_the_run_in_one_line(flow_lab: Lab, flow: str) -> None:
    """asyncio's CancelledError is a BaseException: raised in a step (or reaching
    an async workflow's loop) it escaped the run as a traceback, exit 1 (the code
    of "unknown task"), the step left running and nothing said."""
    lab = flow_lab
    refused, status = _stopped(lab, "--workflow", flow)
    assert "was cancelled while it ran" in _one_error_line(refused.stderr)
    assert _calls(lab) == ["cancels"]
    assert [(s["tool"], s["status"]) for s in status["steps"]] == [("cancels", "running")]
    assert lab.cli("verify", "t").returncode == 0


def test_asyncios_cancel_raised_between_steps_is_one_line(flow_lab: Lab) -> None:
    refused, status = _stopped(flow_lab, "--workflow", "cancel_between")
    assert "raised outside a step, after 1 step call(s): CancelledError" in _one_error_line(
        refused.stderr
    )
    assert [(s["tool"], s["status"]) for s in status["steps"]] == [("first", "done")]
    assert status["status"] == "running"


@pytest.mark.parametrize("declared", [False, True])
def test_an_async_step_in_a_sync_workflow_is_refused_before_it_starts(
    flow_lab: Lab, declared: bool
) -> None:
    """A sync workflow cannot await an ``async def`` step: its attempts stored a
    coroutine that never ran as their error ("Object of type coroutine is not JSON
    serializable", with Python's "never awaited" warnings) until the task failed
    (exit 2). It is the code's error: exit 12 before the step starts, the task
    left for fixed code."""
    lab = flow_lab
    args = f"[{str(declared).lower()}]"
    refused, status = _stopped(lab, "--workflow", "sync_calls_async", "--args", args)
    assert "is an async def" in _one_error_line(refused.stderr)
    assert "RuntimeWarning" not in refused.stderr
    assert _calls(lab) == ["first"]
    assert status["status"] == "running"
    assert [(s["tool"], s["status"]) for s in status["steps"]] == [("first", "done")]
    assert lab.cli("verify", "t").returncode == 0


@pytest.mark.parametrize("flow", ["uncallable", "auncallable"])
def test_a_step_given_no_function_is_refused_before_it_starts(flow_lab: Lab, flow: str) -> None:
    """``ctx.step("second", "log")`` (a name where the function goes) fails every
    attempt alike: it was committed running, retried with its backoff and failed
    the task (exit 2, "'str' object is not callable"). It is the code's error:
    exit 12 before the step starts, the task left for fixed code."""
    lab = flow_lab
    refused, status = _stopped(lab, "--workflow", flow)
    assert "is not callable" in _one_error_line(refused.stderr)
    assert status["status"] == "running"
    assert [(s["tool"], s["status"]) for s in status["steps"]] == [("first", "done")]
    assert lab.cli("verify", "t").returncode == 0


def test_a_step_called_inside_a_step_stops_the_run_without_retrying_or_failing(
    flow_lab: Lab,
) -> None:
    """``ctx.step`` inside a step is the code's error (exit 12), refused before
    the inner step starts: the outer step is not retried nor the task failed
    (it was a step_error, run again up to its attempt limit, then exit 2)."""
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "nested").returncode == 0
    refused = lab.cli("run", "t")
    assert refused.returncode == 12, refused.stderr
    assert "steps do not nest" in _one_error_line(refused.stderr)
    assert _calls(lab) == ["outer"]
    status = lab.cli("status", "t", "--json").json()
    assert status["status"] == "running"
    assert [(s["tool"], s["status"]) for s in status["steps"]] == [("outer", "running")]
    kinds = [e["kind"] for e in lab.cli("export", "t").jsonl()]
    assert "step_error" not in kinds
    checked = lab.cli("verify", "t")
    assert checked.returncode == 0, checked.stdout


def test_an_exception_whose_message_raises_is_still_a_step_error(flow_lab: Lab) -> None:
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "raises_unprintable_in_a_step").returncode == 0
    failed = lab.cli("run", "t")
    assert failed.returncode == 2, failed.stderr
    assert "ApiError (its message raised KeyError)" in _one_error_line(failed.stderr)
    assert _calls(lab) == ["unprintable"] * 3  # its policy's 3 attempts
    assert lab.cli("verify", "t").returncode == 0


def test_an_exception_whose_message_raises_outside_a_step_is_one_line(flow_lab: Lab) -> None:
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "raises_unprintable").returncode == 0
    refused = lab.cli("run", "t")
    assert refused.returncode == 12, refused.stderr
    assert "ApiError (its message raised KeyError)" in _one_error_line(refused.stderr)
