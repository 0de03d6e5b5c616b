"""Fuzzing workflows: the arguments ``create --workflow --args`` takes, and the values
a workflow's steps return.

Every input ends in exit 0 or a documented code with one line on stderr, never
a traceback; refused arguments store nothing (the database is left exactly as
it was); what a step returned and what the workflow returned read back equal
(as JSON holds them), through a fresh connection to the file. The examples are
derandomized, as in ``test_fuzz.py``, so that CI sees the same inputs every time.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import fuzzflows
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_fuzz import FUZZ, JSON, NASTY, call, scratch, verify_clean

import ninelives
from ninelives.errors import InputError, TaskFailed
from ninelives.models import MAX_DEPTH
from ninelives.testing import Lab

TOOLS = ("--tools", "fuzzflows")


def _levels(value: Any) -> int:
    """How deep arrays and objects nest in ``value`` (a scalar is 0)."""
    if isinstance(value, dict):
        return 1 + max(map(_levels, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_levels, value), default=0)
    return 0


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


#: Texts ``--args`` may receive: JSON of every shape, and what JSON parsers disagree on.
ARG_TEXTS = (
    JSON.map(json.dumps)
    | st.lists(JSON, max_size=4).map(json.dumps)
    | st.dictionaries(NASTY, JSON, max_size=4).map(json.dumps)
    | st.sampled_from(
        [
            "[NaN]",
            "[Infinity]",
            "[-Infinity]",
            "[1e999]",
            '{"x": -1e400}',
            "[" + "9" * 5000 + "]",  # more digits than Python parses by default
            deep(31),
            deep(40),
            deep(5000),
            '{"a": 1, "a": 2}',
            "[1,]",
            "['x']",
            "",
            "   ",
            '["\\ud800"]',  # a lone surrogate
            '["\\u0000"]',
            "\ufeff[]",
            "[1] [2]",
        ]
    )
    | NASTY
)


def _parsed(text: str) -> tuple[list[Any], dict[str, Any]]:
    value = json.loads(text)
    return (value, {}) if isinstance(value, list) else ([], value)


def _fingerprint(root: Path) -> Any:
    return Lab(root).fingerprint("t") if (root / "state.db").exists() else None


@FUZZ
@given(text=ARG_TEXTS)
def test_any_workflow_arguments(text: str, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    with scratch(monkeypatch) as root:
        # Another task first: a refused create must leave the file exactly as it was.
        assert call(capsys, *TOOLS, "create", "other", "--workflow", "echo")[0] == 0
        before = _fingerprint(root)
        code, _, err = call(capsys, *TOOLS, "create", "t", "--workflow", "echo", "--args", text)
        assert code in (0, 4), err
        if code == 4:
            assert call(capsys, "status", "t")[0] == 1  # nothing was stored
            assert _fingerprint(root) == before
        else:
            args, kwargs = _parsed(text)
            ran, _, err = call(capsys, *TOOLS, "run", "t", "-q")
            if _levels({"value": {"args": args, "kwargs": kwargs}}) > MAX_DEPTH:
                # Arguments at the limit, wrapped by echo's output: a step output
                # nests at most MAX_DEPTH levels, so the step fails, in one line.
                assert ran == 2, err
                assert "levels deep" in err
                verify_clean(capsys)
                return
            assert ran == 0, err
            _, out, _ = call(capsys, "status", "t", "--json", "--outputs")
            shown = json.loads(out)
            assert shown["workflow"] == "echo"
            assert shown["result"] == {"args": args, "kwargs": kwargs}
            with ninelives.open("state.db") as rt:
                assert rt.result("t") == {"args": args, "kwargs": kwargs}
        verify_clean(capsys)


#: Values a step may return: JSON, and what JSON cannot hold or holds differently.
class Odd:
    def __repr__(self) -> str:
        return "<odd>"


OUTPUTS = (
    JSON
    | st.floats()  # NaN and infinities among them
    | st.integers()
    | st.tuples(JSON, JSON)
    | st.dictionaries(st.integers(-3, 3), JSON, max_size=3)
    | st.dictionaries(st.integers(-3, 3) | NASTY, JSON, max_size=3)
    | st.sets(st.integers(), max_size=3)
    | st.binary(max_size=8)
    | st.sampled_from(
        [
            Odd(),
            {"nested": json.loads(deep(36).replace("[]", '["deep"]'))},
            "x" * 300_000,  # stored as a blob
            [math.inf],
            {"a": {1, 2}},
            10**5000,
            "\ud800",
        ]
    )
)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _plain(value: Any) -> bool:
    """JSON that any store must keep: no NUL, no lone surrogate, not deep, str keys."""
    ok, back = _as_json(value)
    if not ok or back != value or _depth(back) > 16:
        return False
    text = json.dumps(back, ensure_ascii=False)
    return not any(ch == "\0" or 0xD800 <= ord(ch) <= 0xDFFF for ch in text)


def _as_json(value: Any) -> tuple[bool, Any]:
    """Whether standard JSON holds ``value``, and the value JSON gives back."""
    try:
        return True, json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError, RecursionError):
        return False, None


@FUZZ
@given(value=OUTPUTS)
def test_any_step_output(value: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with scratch(monkeypatch) as root:
        fuzzflows.OUTPUT[0] = value
        with ninelives.open(str(root / "state.db")) as rt:
            rt.create("t", fuzzflows.emit)
            try:
                rt.run("t")
                failed = None
            except TaskFailed as exc:
                failed = str(exc)
        with ninelives.open(str(root / "state.db")) as rt:  # read back through a fresh one
            task = rt.status("t")
            if failed is None:
                ok, expected = _as_json(value)
                assert ok, f"stored a value JSON cannot hold: {value!r}"
                assert task.steps[0].output == {"value": expected}
                assert rt.result("t") == expected
            else:
                assert not _plain(value), f"refused plain JSON {value!r}: {failed}"
                assert "emit" in failed, failed  # names the step
                assert task.status.value == "failed"
                with pytest.raises(InputError):
                    rt.result("t")
        assert Lab(root).cli("verify", "--all").returncode == 0
