"""Task ids, crash point names and environment settings (pure)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ninelives import crashpoints
from ninelives.errors import InputError, InvalidTaskId
from ninelives.runtime import check_task_id
from ninelives.settings import Settings

# -- task ids -----------------------------------------------------------------

PATHLIKE_IDS = [
    "../x",
    "a/b",
    "/abs",
    "..",
    ".",
    "",
    "-x",
    "--db",
    ".hidden",
    "a\0b",
    "a\\b",
    "a b",
    "a\nb",
    "tâche",
    "a" * 129,
    "a" * 10_000,
    "_x",
]


@pytest.mark.parametrize("task_id", PATHLIKE_IDS)
def test_ids_that_could_name_a_path_or_option_are_refused(task_id: str) -> None:
    with pytest.raises(InvalidTaskId) as info:
        check_task_id(task_id)
    assert "\n" not in str(info.value).replace(repr(task_id), "")


@pytest.mark.parametrize("task_id", ["a", "0", "demo", "A.b_c-9", "x..y", "a" * 128, "t-2"])
def test_plain_ids_are_accepted(task_id: str) -> None:
    # The control: the same check lets every plain id through unchanged.
    assert check_task_id(task_id) == task_id


# -- crash points ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("before_effect:0", ("before_effect", 0)),
        ("after_effect:2", ("after_effect", 2)),
        ("after_commit:12", ("after_commit", 12)),
        ("artifact_before_link", ("artifact_before_link", None)),
    ],
)
def test_crash_points_parse(value: str, parsed: tuple[str, int | None]) -> None:
    assert crashpoints.parse(value) == parsed


def test_every_named_point_parses() -> None:
    for point in crashpoints.POINTS:
        assert crashpoints.parse(f"{point}:1") == (point, 1)


@pytest.mark.parametrize(
    "value", ["bogus", "bogus:1", "before_effect:x", "before_effect:-1", "after_effect:", ":1", ""]
)
def test_bad_crash_points_are_refused(value: str) -> None:
    with pytest.raises(ValueError, match="crash point"):
        crashpoints.parse(value)


# -- settings -------------------------------------------------------------------


def test_defaults_without_any_variable() -> None:
    assert Settings.from_env({}) == Settings(
        max_attempts=3,
        step_delay=0.0,
        artifacts="artifacts",
        unsafe_effects=False,
        llm="stub",
        ollama_url="http://127.0.0.1:11434",
        ollama_model="llama3.2",
        workspace=".",
    )


def test_every_variable_is_read() -> None:
    settings = Settings.from_env(
        {
            "AGENT_MAX_ATTEMPTS": "5",
            "AGENT_STEP_DELAY": "0.25",
            "AGENT_ARTIFACTS": "out",
            "AGENT_UNSAFE_EFFECTS": "1",
            "AGENT_LLM": "ollama",
            "OLLAMA_URL": "http://127.0.0.1:1",
            "OLLAMA_MODEL": "tiny",
            "NINELIVES_WORKSPACE": "/w",
            "AGENT_CRASH_AT": "after_commit:1",
        }
    )
    assert settings == Settings(
        max_attempts=5,
        step_delay=0.25,
        artifacts="out",
        unsafe_effects=True,
        llm="ollama",
        ollama_url="http://127.0.0.1:1",
        ollama_model="tiny",
        workspace="/w",
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_attempts", 0), ("max_attempts", True), ("max_attempts", 2.0),
        ("step_delay", -1.0), ("backoff", float("nan")), ("backoff", 31),
        ("max_output", 0), ("blob_threshold", -5), ("max_recoveries", -1),
        ("llm_timeout", float("inf")), ("max_fetch", "1"), ("artifacts", ""), ("workspace", None),
    ],
)  # fmt: skip
def test_settings_given_in_code_are_checked_before_anything_opens(
    tmp_path: Path, field: str, value: object
) -> None:
    # A negative step delay failed inside a step already committed running (a
    # bare ValueError from time.sleep), an empty artifacts folder after the
    # effect, max_attempts=0 ran once: each value a variable cannot give.
    import ninelives
    from ninelives.runtime.core import Runtime

    bad = Settings()._replace(**{field: value})
    with pytest.raises(InputError, match=f"Settings.{field} must"):
        ninelives.open(str(tmp_path / "state.db"), settings=bad)
    assert list(tmp_path.iterdir()) == []
    with ninelives.open(str(tmp_path / "state.db"), settings=Settings()) as rt:
        with pytest.raises(InputError, match=f"Settings.{field} must"):
            Runtime(rt.store, settings=bad)


def test_the_edges_of_each_range_are_accepted() -> None:
    from ninelives.settings import NUMBERS

    for field, (_name, kind, minimum, maximum) in NUMBERS.items():
        for edge in (minimum, maximum):
            if edge is not None:
                assert Settings()._replace(**{field: kind(edge)}).checked()


@pytest.mark.parametrize(("raw", "unsafe"), [("", False), ("0", False), ("1", True), ("yes", True)])
def test_unsafe_effects_flag(raw: str, unsafe: bool) -> None:
    assert Settings.from_env({"AGENT_UNSAFE_EFFECTS": raw}).unsafe_effects is unsafe


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("AGENT_MAX_ATTEMPTS", "abc"),
        ("AGENT_MAX_ATTEMPTS", "0"),
        ("AGENT_MAX_ATTEMPTS", "-1"),
        ("AGENT_MAX_ATTEMPTS", "1.5"),
        ("AGENT_STEP_DELAY", "abc"),
        ("AGENT_STEP_DELAY", "-1"),
        ("AGENT_STEP_DELAY", "nan"),
        ("AGENT_CRASH_AT", "bogus"),
        ("AGENT_CRASH_AT", "before_effect:x"),
    ],
)
def test_malformed_values_are_input_errors(name: str, raw: str) -> None:
    with pytest.raises(InputError) as info:
        Settings.from_env({name: raw})
    assert str(info.value).startswith(name)


@pytest.mark.parametrize("raw", ["inf", "1e300", "86400.5"])
def test_a_delay_too_long_to_sleep_is_refused(raw: str) -> None:
    # time.sleep() raises OverflowError past ~292 years: refused here instead.
    with pytest.raises(InputError, match="at most"):
        Settings.from_env({"AGENT_STEP_DELAY": raw})


def test_the_longest_delay_is_accepted() -> None:
    assert Settings.from_env({"AGENT_STEP_DELAY": "86400"}).step_delay == 86400


@pytest.mark.parametrize("task_id", [5, None, b"t1", ["t1"]])
def test_a_task_id_that_is_not_text_is_an_invalid_id_for_every_method(
    tmp_path: Path, task_id: object
) -> None:
    # The library's methods took one for text (AttributeError: 'int' object has
    # no attribute 'encode', from deep inside); a task id is data, refused as such.
    import ninelives

    plan = {"goal": "g", "steps": [{"tool": "fetch", "input": {"path": "x"}}]}
    with ninelives.open(str(tmp_path / "state.db")) as rt:
        rt.create("t1", plan)
        before = [e.seq for e in rt.export("t1")]
        calls = [
            lambda: rt.status(task_id), lambda: rt.run(task_id), lambda: rt.export(task_id),
            lambda: rt.cancel(task_id), lambda: rt.retry(task_id), lambda: rt.result(task_id),
            lambda: rt.fork(task_id, "t2", start=0), lambda: rt.fork("t1", task_id, start=0),
            lambda: rt.create(task_id, plan), lambda: rt.submit(task_id, plan),
        ]  # fmt: skip
        for call in calls:
            with pytest.raises(InvalidTaskId, match="invalid task id"):
                call()
        assert [e.seq for e in rt.export("t1")] == before
        assert rt.status("t1").status.value == "pending"


def _shout(step_input: object, ctx: object) -> dict[str, str]:
    return {}


@pytest.mark.parametrize(
    ("name", "fn", "version", "why"),
    [
        ("", _shout, None, "name"), (5, _shout, None, "name"), (None, _shout, None, "name"),
        ("shout", 5, None, "not callable"), ("shout", "shout", None, "not callable"),
        ("shout", _shout, 2, "version"), ("shout", lambda step_input: {}, None, "must take"),
        ("shout", lambda a, b, c, d: {}, None, "must take"),
    ],
)  # fmt: skip
def test_a_tool_declared_wrong_is_refused_where_it_is_declared(
    name: object, fn: object, version: object, why: str
) -> None:
    # Registered before, each failed later and elsewhere: a tool no plan can
    # name, a step that failed its attempts on "'int' object is not callable",
    # a version journaled as a number beside the text every other one is.
    from ninelives.errors import PlanError
    from ninelives.tools import Registry, tool

    registry = Registry(entry_points=False)
    if version is None:  # register() takes none
        with pytest.raises(PlanError, match=why):
            registry.register(name, fn)  # type: ignore[arg-type]
        with pytest.raises(PlanError, match=why):
            registry.register(name)(fn)  # type: ignore[arg-type]
    if name is not None:  # tool() names an unnamed function after it
        with pytest.raises(PlanError, match=why):
            tool(name, version=version)(fn)  # type: ignore[arg-type]
    assert registry.names() == []


@pytest.mark.parametrize("reason", [5, b"why", ["why"]])
def test_a_cancel_reason_that_is_not_text_is_bad_input(tmp_path: Path, reason: object) -> None:
    # It raised TypeError ("object of type 'int' has no len()") from the check.
    import ninelives

    plan = {"goal": "g", "steps": [{"tool": "fetch", "input": {"path": "x"}}]}
    with ninelives.open(str(tmp_path / "state.db")) as rt:
        rt.create("t1", plan)
        with pytest.raises(InputError, match="--reason must be text"):
            rt.cancel("t1", reason=reason)  # type: ignore[arg-type]
        assert rt.status("t1").status.value == "pending"


class _Tools:
    def __init__(self) -> None:
        self.calls = 0

    def with_context(self, step_input: object, ctx: Any) -> dict[str, Any]:
        return {"form": "context", "step": ctx.step}

    def contract(self, step_input: object, ctx: object, idem_key: str) -> dict[str, Any]:
        return {"form": "contract", "key": idem_key}


def test_every_form_of_tool_runs_whichever_way_it_is_registered(tmp_path: Path) -> None:
    # registry.register took every function for the contract's (input, ctx,
    # idem_key): an (input, ctx) one, which @tool takes, failed each attempt on
    # "takes 2 positional arguments but 3 were given", as did a method of either
    # form (its self counted as an argument).
    import ninelives
    from ninelives.tools import Registry

    tools = _Tools()
    registry = Registry(entry_points=False)
    registry.register("lambda_context", lambda step_input, ctx: {"form": "context"})
    registry.register("method_context", tools.with_context)
    registry.register("method_contract", tools.contract)
    registry.register("defaults", lambda step_input, ctx, idem_key, extra=1: {"form": "contract"})
    names = ["lambda_context", "method_context", "method_contract", "defaults"]
    plan = {"goal": "g", "steps": [{"tool": name, "input": {}} for name in names]}
    with ninelives.open(str(tmp_path / "state.db"), tools=registry) as rt:
        rt.create("t1", plan)
        outputs = rt.run("t1").outputs()
    assert outputs == {
        0: {"form": "context"},
        1: {"form": "context", "step": 1},
        2: {"form": "contract", "key": "t1-2"},
        3: {"form": "contract"},
    }


@pytest.mark.parametrize("step", ["1", True, 1.0])
def test_a_retry_step_that_is_not_an_index_is_bad_input(tmp_path: Path, step: object) -> None:
    # "1" read "step 1 of task 'f' has not failed (step 1 has)"; True and 1.0
    # were taken for step 1.
    import ninelives

    plan = {"goal": "g", "steps": [{"tool": "fetch", "input": {"path": "missing"}}]}
    settings = Settings(backoff=0, max_attempts=1, workspace=str(tmp_path))
    with ninelives.open(str(tmp_path / "state.db"), settings=settings) as rt:
        rt.create("f", plan)
        with pytest.raises(ninelives.TaskFailed):
            rt.run("f")
        with pytest.raises(InputError, match="must be a step index"):
            rt.retry("f", step=step)  # type: ignore[arg-type]
        assert rt.status("f").status.value == "failed"
