"""Hostile model replies through each framework adapter's durable model step.

A reply is run in a workflow, replayed from the journal (after an approval, in
a new run) and verified (see ``replies.py``). Whatever the reply, the run ends
done or with ninelives' own one-line error, never another exception; a replay
reads back the same answer and asks the model nothing; ``verify`` is clean.

Tool-call arguments: nested past 29 levels (as the plan's agent rules) they are
that call's error, read by the model, the tool not run; multi-megabyte, they
reach the tool whole; ``NaN``, ``Infinity`` and ``1e999`` reach it as the
framework parses them, the same on a replay. A lone surrogate is stored as
U+FFFD. The fuzz targets are derandomized with a fixed budget.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from replies import exercise

FRAMEWORKS = ["pydantic_ai", "openai_agents"]


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("levels", [26, 40])
def test_arguments_nested_past_the_limit_are_that_calls_error(framework: str, levels: int) -> None:
    found = exercise(framework, [("call", "echo", {"value": nested(levels)})])
    assert found["outcome"] == "done", found
    if levels > 29:
        assert not any(r.startswith("echo") for r in found["ran"])  # the tool did not run
        assert "echo got" not in found["answer"]
    else:
        assert f"echo {2 * levels + 1}" in found["ran"]
        assert f"echo got {2 * levels + 1} characters" in found["answer"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_arguments_too_deep_to_parse_are_that_calls_error(framework: str) -> None:
    text = '{"value": ' + "[" * 5000 + "]" * 5000 + "}"
    found = exercise(framework, [("call", "echo", text)])
    assert found["outcome"] == "done", found
    assert found["ran"] == ["model", "model"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_multi_megabyte_argument_reaches_the_tool_whole(framework: str) -> None:
    found = exercise(framework, [("call", "echo", {"value": "x" * 3_000_000})])
    assert found["outcome"] == "done", found
    assert "echo got 3000002 characters" in found["answer"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize(
    ("arguments", "size"),
    [('{"value": NaN}', 3), ('{"value": Infinity}', 3), ('{"value": 1e999}', 3)],
)
def test_non_finite_arguments_reach_the_tool_as_parsed(
    framework: str, arguments: str, size: int
) -> None:
    found = exercise(framework, [("call", "echo", arguments)])
    assert found["outcome"] == "done", found
    assert found["ran"] == ["model", f"echo {size}", "model"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_lone_surrogate_in_call_arguments_is_stored_as_a_replacement(framework: str) -> None:
    found = exercise(framework, [("call", "echo", '{"value": "a\\ud800b"}')])
    assert found["outcome"] == "done", found
    assert found["ran"] == ["model", "echo 5", "model"]  # 'a\ufffdb' with its quotes


def test_a_model_request_that_fails_fails_its_step_once_saying_why() -> None:
    """Pydantic AI lets a request's handler run once: the step is not retried in
    the same process (that could only fail with the framework's own UserError)."""
    # FunctionModel's usage estimate cannot encode a lone surrogate: it raises.
    found = exercise("pydantic_ai", [("call", "echo", {"value": "a\ud800b"})])
    assert found["outcome"] == "StepFailed", found
    assert "the model request failed: PydanticSerializationError" in found["error"]
    assert "'ninelives retry' asks again" in found["error"]
    assert found["ran"] == ["model"]


FUZZ = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TEXT = st.text(
    st.characters(codec="utf-8", exclude_categories=["Cs"])
    | st.sampled_from(["\ud800", "\udfff", "\x00", "\x1b", "\u202e"]),
    max_size=20,
)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
RAW = st.sampled_from(
    [
        '{"value": NaN}', '{"value": -Infinity}', '{"value": 1e999}', '{"value": ', "[]",
        '"text"', "null", "", '{"value": "\\ud800"}', '{"value": 1, "value": 2}',
        '{"value": ' + "[" * 40 + "]" * 40 + "}", '{"value": ' + "{" * 3000,
    ]
)  # fmt: skip
ARGUMENTS = (
    st.fixed_dictionaries({}, optional={"value": VALUES, "other": VALUES})
    | st.builds(lambda n: {"value": nested(n)}, st.integers(0, 45))
    | RAW
    | TEXT
)
NAMES = st.sampled_from(["echo", "echo", "echo", "missing", "", "ECHO", "echo\x00"])
PARTS = st.one_of(
    st.tuples(st.just("text"), TEXT | st.sampled_from(["", "x" * 200_000])),
    st.tuples(st.just("call"), NAMES, ARGUMENTS),
)
REPLIES = st.lists(PARTS, max_size=3)
#: Where a hostile reply may end a run besides done: Pydantic AI's step failing
#: in one line (its scripted model cannot count a lone surrogate's tokens); the
#: SDK refusing a call of a tool the agent lacks (its ModelBehaviorError, which
#: ends its own runs too), in one line, with nothing written.
ENDINGS = {
    "pydantic_ai": ("StepFailed", "the model request failed"),
    "openai_agents": ("WorkflowError", "ModelBehaviorError: Tool "),
}


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_fuzz_replies_through_the_adapter(framework: str) -> None:
    outcomes: list[str] = []

    @FUZZ
    @given(reply=REPLIES)
    def one(reply: list[tuple[Any, ...]]) -> None:
        found = exercise(framework, reply)
        if found["outcome"] != "done":
            kind, says = ENDINGS[framework]
            assert found["outcome"] == kind, found
            assert says in found["error"], found
        outcomes.append(found["outcome"])

    one()
    assert "done" in outcomes  # the target reaches the end of a run, not only errors
