"""Code that no longer matches a workflow task's journal: refused with one line
and exit 12, the task's steps untouched, resumed by the right code; found
ahead of time by replay-check (exit 7). With the name check switched off
(test-only), the diverged code runs and the test sees it: the negative control."""

from __future__ import annotations

from pathlib import Path

import pytest

from ninelives.testing import Lab

pytestmark = pytest.mark.crash

FLOWS = (Path(__file__).parent / "wflows.py").read_text(encoding="utf-8")
#: The same module with step 1 renamed, and with a triage that stops after step 0.
RENAMED = FLOWS.replace('ctx.step("summarize"', 'ctx.step("summary"')
SHORT = FLOWS.replace(
    '    summary = ctx.step("summarize", first_line, t["text"])\n',
    '    return {"short": t["text"]}\n    summary = ctx.step("summarize", first_line, t["text"])\n',
)
#: The same module reading a key step 0 never returned, and a workflow returning a set.
KEYED = FLOWS.replace('first_line, t["text"])', 'first_line, t["body"])') + (
    '\n\n@ninelives.workflow("setful")\ndef setful(ctx, ticket):\n'
    '    return {ctx.step("read", read_ticket, ticket)["text"]}\n'
)


@pytest.fixture
def flow_lab(lab: Lab) -> Lab:
    lab.write("wflows.py", FLOWS)
    lab.write("renamed.py", RENAMED)
    lab.write("short.py", SHORT)
    lab.write("keyed.py", KEYED)
    return lab


def _halfway(lab: Lab, task: str) -> None:
    """A triage task killed after its step 1 committed: steps 0 and 1 done."""
    made = lab.cli("--tools", "wflows", "create", task, "--workflow", "triage", "--args", '["T"]')
    assert made.returncode == 0, made.stderr
    killed = lab.cli("--tools", "wflows", "run", task, AGENT_CRASH_AT="after_commit:1")
    assert killed.returncode == -9


@pytest.mark.parametrize(
    ("module", "line"),
    [
        ("renamed", "step 1: the journal holds 'summarize', the code calls 'summary'"),
        ("short", "step 1: the journal holds 'summarize', the code returns before calling it"),
    ],
)
def test_diverged_code_is_refused_and_the_right_code_resumes(
    flow_lab: Lab, module: str, line: str
) -> None:
    lab = flow_lab
    _halfway(lab, "t")
    before = lab.cli("status", "t", "--json", "--outputs").json()
    refused = lab.cli("--tools", module, "run", "t")
    assert refused.returncode == 12
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "task 't'" in refused.stderr
    assert line in refused.stderr
    after = lab.cli("status", "t", "--json", "--outputs").json()
    assert after == before  # steps and outputs as they were; not failed
    assert after["status"] != "failed"
    checked = lab.cli("--tools", module, "replay-check", "t")
    assert checked.returncode == 7
    assert checked.stdout.startswith("t: step 1: journal 'summarize', code ")
    assert lab.cli("--tools", "wflows", "replay-check", "t").returncode == 0
    resumed = lab.cli("--tools", "wflows", "run", "t")
    assert resumed.returncode == 0, resumed.stderr
    status = lab.cli("status", "t", "--json").json()
    assert status["result"] == {"ticket": "T", "summary": "ticket T", "note": "summary: ticket T"}
    assert lab.cli("verify", "t").returncode == 0


def test_replay_check_all_names_each_diverged_task_once(flow_lab: Lab) -> None:
    lab = flow_lab
    _halfway(lab, "a")
    _halfway(lab, "b")
    made = lab.cli("--tools", "wflows", "create", "c", "--workflow", "probed", "--args", '["T"]')
    assert made.returncode == 0, made.stderr
    assert lab.cli("create", "plain", str(lab.guide_setup())).returncode == 0
    done = lab.cli("--tools", "wflows", "create", "d", "--workflow", "triage", "--args", '["T"]')
    assert done.returncode == 0
    assert lab.cli("--tools", "wflows", "run", "d").returncode == 0
    before = lab.fingerprint("a", "b", "c", "d")
    checked = lab.cli("--tools", "renamed", "replay-check", "--all")
    assert checked.returncode == 7
    lines = checked.stdout.splitlines()
    assert lines == [
        "a: step 1: journal 'summarize', code 'summary'",
        "b: step 1: journal 'summarize', code 'summary'",
    ]
    assert lab.fingerprint("a", "b", "c", "d") == before  # replay-check writes nothing
    assert lab.cli("--tools", "wflows", "replay-check", "--all").returncode == 0
    assert lab.cli("--tools", "wflows", "replay-check", "plain").returncode == 4
    assert lab.cli("--tools", "wflows", "replay-check").returncode == 4


def test_replay_check_all_reports_a_task_it_cannot_replay_and_checks_the_rest(
    flow_lab: Lab,
) -> None:
    """A task whose workflow the loaded code does not define is a line of
    ``--all``'s report and the others are still checked; ``--all`` stopped at it
    (exit 4, nothing printed), so a diverged task after it went unreported."""
    lab = flow_lab
    lab.write(
        "lonely.py", "import ninelives\n\n\n@ninelives.workflow\ndef lonely(ctx):\n    return 1\n"
    )
    assert lab.cli("--tools", "lonely", "create", "a", "--workflow", "lonely").returncode == 0
    _halfway(lab, "b")
    assert lab.cli("status", "b").returncode == 0  # a reader's marks in -shm, as replay-check's
    before = lab.fingerprint("a", "b")
    checked = lab.cli("--tools", "renamed", "replay-check", "--all")
    assert checked.returncode == 7, checked.stderr
    lines = checked.stdout.splitlines()
    assert len(lines) == 2, checked.stdout
    assert lines[0].startswith("a: cannot be replayed here: ")
    assert "lonely" in lines[0]
    assert lines[1] == "b: step 1: journal 'summarize', code 'summary'"
    assert "2 of 2 workflow task(s) diverge or cannot be replayed here" in checked.stderr
    assert lab.fingerprint("a", "b") == before
    # One task named: its own error and exit code, as before.
    assert lab.cli("--tools", "renamed", "replay-check", "a").returncode == 4


def test_replay_check_reports_code_that_fails_while_it_replays_the_journal(
    flow_lab: Lab,
) -> None:
    """Code that raises on the journal's own values (a key its step never returned),
    or returns a value that cannot be stored, makes every run exit 12 having run no
    step; replay-check, which runs the same code on the same values, said the task
    replays on this code (exit 0), so the deploy check passed such code."""
    lab = flow_lab
    _halfway(lab, "t")
    made = lab.cli("--tools", "keyed", "create", "s", "--workflow", "setful", "--args", '["T"]')
    assert made.returncode == 0, made.stderr
    assert lab.cli("--tools", "keyed", "run", "s").returncode == 12
    assert lab.cli("--tools", "keyed", "run", "t").returncode == 12
    before = lab.fingerprint("s", "t")
    checked = lab.cli("--tools", "keyed", "replay-check", "--all")
    assert checked.returncode == 7, checked.stderr
    s_line, t_line = sorted(checked.stdout.splitlines())
    assert s_line.startswith("s: cannot be replayed here: ")
    assert "return value cannot be stored" in s_line
    assert t_line.startswith("t: cannot be replayed here: ")
    assert "raised outside a step, after 1 step call(s): KeyError: 'body'" in t_line
    assert "2 of 2 workflow task(s) diverge or cannot be replayed here" in checked.stderr
    one = lab.cli("--tools", "keyed", "replay-check", "t")
    assert one.returncode == 7, one.stderr
    assert one.stdout.startswith("t: cannot be replayed here: ")
    assert lab.fingerprint("s", "t") == before  # replay-check writes nothing
    assert lab.cli("--tools", "wflows", "replay-check", "t").returncode == 0
    assert lab.cli("--tools", "wflows", "run", "t").returncode == 0


def test_negative_control_without_the_name_check_diverged_code_runs(flow_lab: Lab) -> None:
    lab = flow_lab
    _halfway(lab, "t")
    switch = "unsafe-test-only:" + lab.db
    ran = lab.cli("--tools", "renamed", "run", "t", NINELIVES_TEST_SKIP_NAME_CHECK=switch)
    # The renamed code is answered with 'summarize''s output and runs to the end:
    # nothing refuses it, which is what the check prevents.
    assert ran.returncode == 0, ran.stderr
    assert lab.cli("status", "t", "--json").json()["status"] == "done"
    # The switch needs this very database: any other value does nothing.
    _halfway(lab, "u")
    assert (
        lab.cli("--tools", "renamed", "run", "u", NINELIVES_TEST_SKIP_NAME_CHECK="1").returncode
        == 12
    )


CATCHER = (
    FLOWS
    + """

@ninelives.workflow("catcher")
def catcher(ctx, ticket):
    ctx.step("read", read_ticket, ticket)
    try:
        ctx.step("summary" if ctx_is_new() else "summarize", first_line, "a\\nb")
    except BaseException:
        return {"caught": True}
    return {"caught": False}


def ctx_is_new():
    import os
    return os.environ.get("NEW_CODE") == "1"
"""
)


def test_a_workflow_that_catches_the_divergence_is_refused_all_the_same(lab: Lab) -> None:
    lab.write("catchers.py", CATCHER)
    made = lab.cli("--tools", "catchers", "create", "t", "--workflow", "catcher", "--args", '["T"]')
    assert made.returncode == 0, made.stderr
    killed = lab.cli("--tools", "catchers", "run", "t", AGENT_CRASH_AT="after_commit:1")
    assert killed.returncode == -9
    before = lab.cli("status", "t", "--json", "--outputs").json()
    refused = lab.cli("--tools", "catchers", "run", "t", NEW_CODE="1")
    assert refused.returncode == 12, refused.stderr
    assert lab.cli("status", "t", "--json", "--outputs").json() == before


def test_doctor_sends_a_stopped_workflow_task_to_replay_check_first(flow_lab: Lab) -> None:
    """A workflow task refused for diverged code (exit 12) stays ``running`` with
    no process holding it: doctor reports it, but ``run`` alone only exits 12
    again, so its fix names replay-check first. A plan task keeps the plain fix."""
    lab = flow_lab
    _halfway(lab, "t")
    assert lab.cli("--tools", "renamed", "run", "t").returncode == 12
    found = lab.cli("doctor")
    assert found.returncode == 7, found.stderr
    line = next(x for x in found.stdout.splitlines() if x.startswith("running: t:"))
    assert "or it stopped at exit 12" in line, line
    assert line.endswith("(fix: ninelives replay-check t, then ninelives run t)"), line
    lab.write("in.txt", "hello\n")
    plan = {"goal": "g", "steps": [{"tool": "fetch", "input": {"path": "in.txt"}}]}
    assert lab.cli("create", "p", str(lab.write_plan(plan))).returncode == 0
    assert lab.cli("run", "p", AGENT_CRASH_AT="after_effect:0").returncode == -9
    plain = next(x for x in lab.cli("doctor").stdout.splitlines() if x.startswith("running: p:"))
    assert plain.endswith("(its process died) (fix: ninelives run p)"), plain


KINDS = """
import os

import ninelives


def five():
    with open("calls.log", "a") as f:
        f.write("five\\n")
    return 5


@ninelives.workflow
def review(ctx):
    if os.environ.get("AS") == "step":
        got = ctx.step("ok", five)
    else:
        got = ctx.approval("ok", "go?")
    return {"got": got, "then": ctx.step("then", five)}
"""


@pytest.mark.parametrize(("first", "then"), [("approval", "step"), ("step", "approval")])
def test_a_step_that_became_an_approval_of_its_name_diverges(
    lab: Lab, first: str, then: str
) -> None:
    """``ctx.approval("ok")`` changed into ``ctx.step("ok", fn)`` (or back) keeps
    the name, and the name was all replay compared: the approval's answer,
    ``{"approved": true}``, was returned as the step's value, its function never
    called, and replay-check found nothing."""
    lab.write("kinds.py", KINDS)
    lab.base_env["NINELIVES_TOOLS"] = "kinds"
    assert lab.cli("create", "t", "--workflow", "review").returncode == 0
    if first == "approval":
        assert lab.cli("run", "t", AS=first).returncode == 8
        assert lab.cli("approve", "t", "0").returncode == 0
    else:
        assert lab.cli("run", "t", AS=first, AGENT_CRASH_AT="after_commit:0").returncode == -9
        (lab.root / "calls.log").unlink()
    before = lab.cli("status", "t", "--json", "--outputs").json()["steps"]
    checked = lab.cli("replay-check", "t", AS=then)
    assert checked.returncode == 7, checked.stdout
    assert checked.stdout.startswith(f"t: step 0: journal {first} 'ok', code {then} 'ok'")
    refused = lab.cli("run", "t", AS=then)
    assert refused.returncode == 12, refused.stderr
    assert f"the journal holds {first} 'ok', the code calls {then} 'ok'" in refused.stderr
    assert lab.cli("status", "t", "--json", "--outputs").json()["steps"] == before
    assert not (lab.root / "calls.log").exists()
    resumed = lab.cli("run", "t", AS=first)
    assert resumed.returncode == 0, resumed.stderr
