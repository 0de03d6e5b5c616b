"""Plan parsing and validation (pure: no file, no database)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ninelives.errors import PlanError
from ninelives.plan import (
    MAX_DEPTH,
    MAX_PLAN_BYTES,
    Plan,
    StepSpec,
    as_mapping,
    parse_plan,
    plan_from_dict,
    validate,
)
from ninelives.settings import Settings
from ninelives.tools.builtin import default_registry

GUIDE = {
    "goal": "Summarize notes into a report",
    "steps": [
        {"tool": "fetch", "input": {"path": "input/notes.txt"}},
        {"tool": "summarize", "input": {"from": 0}},
        {"tool": "write_artifact", "input": {"from": 1}},
    ],
}


def _steps(*inputs: dict[str, Any]) -> dict[str, Any]:
    """A plan whose step 0 is a fetch and whose later steps summarize with ``inputs``."""
    steps = [{"tool": "fetch", "input": {"path": "a.txt"}}]
    steps += [{"tool": "summarize", "input": i} for i in inputs]
    return {"goal": "g", "steps": steps}


def _lookup(name: str) -> Any:
    return default_registry(Settings()).lookup(name)


def test_guide_plan_parses_to_its_steps() -> None:
    plan = parse_plan(json.dumps(GUIDE))
    assert plan == Plan(
        goal="Summarize notes into a report",
        steps=(
            StepSpec(tool="fetch", input={"path": "input/notes.txt"}),
            StepSpec(tool="summarize", input={"from": 0}),
            StepSpec(tool="write_artifact", input={"from": 1}),
        ),
    )
    validate(plan, _lookup)
    assert as_mapping(plan) == GUIDE


def test_bytes_and_missing_goal_are_accepted() -> None:
    plan = parse_plan(json.dumps({"steps": [{"tool": "fetch", "input": {"path": "x"}}]}).encode())
    assert plan.goal == ""
    assert plan.steps[0].input == {"path": "x"}


def test_step_without_input_gets_an_empty_one() -> None:
    assert plan_from_dict({"steps": [{"tool": "custom"}]}).steps[0].input == {}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (b"", "plan is empty"),
        (b" \n", "plan is empty"),
        (b"not json", "not valid JSON"),
        (b'{"steps": NaN}', "NaN"),
        (b'{"steps": [Infinity]}', "Infinity"),
        (b'{"goal": "\xff", "steps": []}', "not valid JSON"),
        (b"[]", "JSON object"),
        (b'"steps"', "JSON object"),
        (b"null", "JSON object"),
        (b'{"steps": {}}', "'steps' list"),
        (b'{"goal": 3, "steps": []}', "goal"),
        (b'{"steps": []}', "no steps"),
        (b'{"steps": [1]}', "step 0 must be an object"),
        (b'{"steps": [{"input": {}}]}', "step 0 has no tool"),
        (b'{"steps": [{"tool": ""}]}', "step 0 has no tool"),
        (b'{"steps": [{"tool": 5}]}', "step 0 has no tool"),
        (b'{"steps": [{"tool": "fetch", "input": []}]}', "input must be an object"),
        (b'{"goal": "\\ud800", "steps": [{"tool": "fetch"}]}', "surrogate"),
    ],
)
def test_malformed_plans_are_refused(text: bytes, fragment: str) -> None:
    with pytest.raises(PlanError) as info:
        parse_plan(text)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("plan", "fragment"),
    [
        (_steps({"from": 1}), "step 1 'from' is 1"),
        (_steps({"from": 2}, {"from": 0}), "step 1 'from' is 2"),
        (_steps({"from": 7}), "step 1 'from' is 7"),
        (_steps({"from": -1}), "step 1 'from' is -1"),
        (_steps({"from": "0"}), "step 1 'from' must be a step index"),
        (_steps({"from": 0.0}), "step 1 'from' must be a step index"),
        (_steps({"from": True}), "step 1 'from' must be a step index"),
        (_steps({"from": None}), "step 1 'from' must be a step index"),
        ({"steps": [{"tool": "summarize", "input": {"from": 0}}]}, "step 0 'from'"),
    ],
)
def test_from_must_name_an_earlier_step(plan: dict[str, Any], fragment: str) -> None:
    with pytest.raises(PlanError) as info:
        plan_from_dict(plan)
    assert fragment in str(info.value)


def test_from_naming_every_earlier_step_is_accepted() -> None:
    plan = plan_from_dict(_steps({"from": 0}, {"from": 1}, {"from": 0}))
    assert [s.input["from"] for s in plan.steps[1:]] == [0, 1, 0]


def test_size_limit_is_checked_before_decoding() -> None:
    padding = "a" * MAX_PLAN_BYTES
    with pytest.raises(PlanError, match="larger than"):
        parse_plan(json.dumps({"goal": padding, "steps": [{"tool": "fetch"}]}))


def test_a_plan_just_under_the_size_limit_is_accepted() -> None:
    text = json.dumps({"goal": "", "steps": [{"tool": "fetch", "input": {"path": "x"}}]})
    padded = text.replace('"goal": ""', '"goal": "' + "a" * (MAX_PLAN_BYTES - len(text)) + '"')
    assert len(padded) == MAX_PLAN_BYTES
    assert len(parse_plan(padded).goal) == MAX_PLAN_BYTES - len(text)


@pytest.mark.parametrize(
    "text",
    [
        "[" * 5000 + "]" * 5000,  # deep enough to exhaust the recursive decoder
        '{"a":' * 5000 + "1" + "}" * 5000,
        '{"steps": [{"tool": "fetch", "input": '
        + '{"a": ' * (MAX_DEPTH + 1)
        + "1"
        + "}" * (MAX_DEPTH + 1)
        + "}]}",
    ],
)
def test_deep_nesting_is_a_plan_error_not_a_recursion_error(text: str) -> None:
    with pytest.raises(PlanError, match="nested more than"):
        parse_plan(text)


def test_nesting_at_the_limit_is_accepted() -> None:
    # plan (1) > steps list (2) > step (3) > input (4) > nested values up to MAX_DEPTH.
    inner: Any = 1
    for _ in range(MAX_DEPTH - 4):
        inner = {"a": inner}
    plan = parse_plan(json.dumps({"steps": [{"tool": "custom", "input": inner}]}))
    assert plan.steps[0].tool == "custom"


def test_a_cyclic_dict_is_refused_not_walked_forever() -> None:
    step: dict[str, Any] = {"tool": "custom"}
    step["input"] = {"self": step}
    with pytest.raises(PlanError, match="nested"):
        plan_from_dict({"steps": [step]})


def test_a_value_that_is_not_json_data_is_refused() -> None:
    with pytest.raises(PlanError, match="not JSON data"):
        plan_from_dict({"steps": [{"tool": "custom", "input": {"x": {1, 2}}}]})


@pytest.mark.parametrize(
    ("step", "fragment"),
    [
        ({"tool": "nope"}, "unknown tool 'nope'"),
        ({"tool": "fetch", "input": {}}, "'path'"),
        ({"tool": "fetch", "input": {"path": ""}}, "'path'"),
        ({"tool": "fetch", "input": {"path": 3}}, "'path'"),
        ({"tool": "fetch", "input": {"path": "/etc/passwd"}}, "inside the workspace"),
        ({"tool": "fetch", "input": {"path": "../x.txt"}}, "inside the workspace"),
        ({"tool": "fetch", "input": {"path": "in/../../x.txt"}}, "inside the workspace"),
        ({"tool": "fetch", "input": {"path": "in\\..\\..\\x.txt"}}, "inside the workspace"),
        ({"tool": "summarize", "input": {}}, "needs 'from'"),
        ({"tool": "write_artifact", "input": {}}, "needs 'from'"),
    ],
)
def test_validate_checks_each_tool_and_its_input(step: dict[str, Any], fragment: str) -> None:
    plan = plan_from_dict({"steps": [{"tool": "fetch", "input": {"path": "ok.txt"}}, step]})
    with pytest.raises(PlanError) as info:
        validate(plan, _lookup)
    assert fragment in str(info.value)


def test_validate_accepts_relative_paths_with_dots_in_names() -> None:
    plan = plan_from_dict({"steps": [{"tool": "fetch", "input": {"path": "in/..notes/a..b.txt"}}]})
    validate(plan, _lookup)


def _built(goal: Any = "g", steps: Any = None) -> Any:
    from ninelives.plan import Plan, StepSpec

    if steps is None:
        steps = (StepSpec(tool="fetch", input={"path": "x"}),)
    return Plan(goal=goal, steps=steps)


def _spec(**fields: Any) -> Any:
    from ninelives.plan import StepSpec

    return StepSpec(**{"tool": "fetch", "input": {"path": "x"}, **fields})


@pytest.mark.parametrize(
    ("plan", "fragment"),
    [
        (_built(goal=5), "'goal' must be a string"),
        (_built(steps=()), "no steps"),
        (_built(steps=({"tool": "fetch"},)), "StepSpec"),
        (_built(steps=(_spec(input=[1]),)), "input must be an object"),
        (_built(steps=(_spec(tool=""),)), "has no tool"),
        (_built(steps=(_spec(policy={"max_attempts": -5}),)), "'max_attempts' must be"),
        (_built(steps=(_spec(policy={"bogus": 1}),)), "unknown key"),
        (_built(steps=(_spec(tool="summarize", input={"from": 7}),)), "'from'"),
        (_built(steps=(_spec(input={"path": "x", "n": "\x00"}),)), "NUL"),
        (_built(goal="\ud800"), "not valid Unicode"),
    ],
)
def test_a_plan_built_in_code_is_checked_as_a_parsed_one(
    tmp_path: Any, plan: Any, fragment: str
) -> None:
    # A Plan given to create skipped every check of the plan's shape: a policy of
    # -5 attempts ran once, a task with no steps was created and "done", an input
    # that is a list raised AttributeError, as did a goal that is a number.
    import ninelives

    with ninelives.open(str(tmp_path / "state.db")) as rt:
        with pytest.raises(PlanError, match=fragment):
            rt.create("t1", plan)
        assert rt.store.task_ids() == []
