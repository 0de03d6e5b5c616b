"""The workflow decorators and their checks, without a store."""

from __future__ import annotations

from typing import Any

import pytest

import ninelives
from ninelives.durable import lookup, parse_arguments, prepare, registered, spec_of
from ninelives.errors import InvalidTaskId, PlanError


def test_workflow_registers_by_name_and_defaults_to_the_function_name() -> None:
    @ninelives.workflow
    def unit_plain(ctx: Any) -> None:
        return None

    @ninelives.workflow("unit-named", version="2")
    async def unit_async(ctx: Any) -> None:
        return None

    assert lookup("unit_plain").fn is unit_plain.fn
    assert registered()["unit-named"].version == "2"
    assert registered()["unit-named"].is_async is True
    assert unit_plain.is_async is False
    with pytest.raises(PlanError, match="unknown workflow 'nope'"):
        lookup("nope")


def test_a_step_called_outside_a_workflow_is_a_plain_call() -> None:
    @ninelives.step(max_attempts=2)
    def add(a: int, b: int) -> int:
        assert ninelives.current_step() is None
        return a + b

    assert add(1, 2) == 3
    assert add.policy == {"max_attempts": 2}
    assert add.name == "add"
    assert ninelives.current_step() is None


@pytest.mark.parametrize(
    "policy",
    [
        {"max_attempts": 0},
        {"timeout": -1},
        {"on_unknown": "maybe"},
        {"on_unknown": "probe"},  # without a probe
        {"probe": "not callable"},
        {"retries": 3},
    ],
)
def test_bad_step_policies_are_refused(policy: dict[str, Any]) -> None:
    with pytest.raises(PlanError):
        ninelives.step(**policy)


def test_arguments_are_canonical_json_in_the_goal_and_read_back() -> None:
    flow = ninelives.workflow("unit-args")(lambda ctx, *a, **k: None)
    plan = prepare("t", flow, [1, {"b": 2, "a": [1.5]}], {"z": "é"})
    assert plan.steps == ()
    assert (
        plan.goal == 'workflow:{"args":[1,{"a":[1.5],"b":2}],"kwargs":{"z":"é"},"name":"unit-args"}'
    )
    spec = spec_of(plan.goal)
    assert spec is not None
    assert (spec.name, spec.args, spec.kwargs) == (
        "unit-args",
        [1, {"a": [1.5], "b": 2}],
        {"z": "é"},
    )
    assert spec_of("a plan's goal") is None


def _deep(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    "args", [[float("nan")], [float("inf")], [object()], ["\ud800"], [_deep(40)]]
)
def test_arguments_a_store_cannot_keep_are_refused(args: list[Any]) -> None:
    flow = ninelives.workflow("unit-bad")(lambda ctx, *a: None)
    with pytest.raises(PlanError):
        prepare("t", flow, args, {})


def test_a_nul_in_an_argument_is_kept_escaped() -> None:
    flow = ninelives.workflow("unit-nul")(lambda ctx, *a: None)
    plan = prepare("t", flow, ["a\x00b"], {})
    assert "\x00" not in plan.goal
    spec = spec_of(plan.goal)
    assert spec is not None
    assert spec.args == ["a\x00b"]


def test_ids_and_argument_text_are_checked() -> None:
    flow = ninelives.workflow("unit-ids")(lambda ctx: None)
    with pytest.raises(InvalidTaskId):
        prepare("../x", flow, [], {})
    assert parse_arguments("[1]") == ([1], {})
    assert parse_arguments('{"a": 1}') == ([], {"a": 1})
    for bad in ("NaN", "[NaN]", "{", "3", '"s"', "[" * 100_000, '{"a": 1, "a": 2}'):
        with pytest.raises(PlanError):
            parse_arguments(bad)


def test_a_plan_cannot_take_a_workflow_goal() -> None:
    from ninelives.runtime import prepare as prepare_plan
    from ninelives.settings import Settings
    from ninelives.tools.builtin import default_registry

    tools = default_registry(Settings())
    steps = [{"tool": "fetch", "input": {"path": "a"}}]
    prepare_plan("t", {"goal": "workflows: not one", "steps": steps}, tools)  # the control
    with pytest.raises(PlanError, match="kept for workflow tasks"):
        prepare_plan("t", {"goal": 'workflow:{"name":"x"}', "steps": steps}, tools)
