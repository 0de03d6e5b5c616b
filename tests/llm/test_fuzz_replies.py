"""Fuzzing a model's replies and their call arguments: deep, huge, non-finite, not
JSON, of the wrong types, with the tools an agent may and may not call.

A loopback model server answers the first turn with the generated body (both wire
formats) and every later one with a plain answer. Whatever the reply, the turn
either commits (its bad calls as call errors) or records a ``step_error``: ``run``
ends in a documented code with no traceback, and ``status``, ``export`` and
``verify --all --artifacts`` still read the task. Derandomized with a fixed
budget, so CI sees the same replies every time.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ninelives import cli
from ninelives.testing.fakellm import Turn, fake_model_server

FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
PLAN = {
    "goal": "Read and publish",
    "steps": [{"tool": "fetch", "input": {"path": "input/notes.txt"}}],
    "agent": {"tools": ["fetch", "write_artifact"], "max_turns": 3},
}
TEXT = st.text(
    st.characters(codec="utf-8", exclude_categories=["Cs"]) | st.sampled_from("\x1b\r\n\u202e"),
    max_size=30,
)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | TEXT
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3)
)


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


#: Arguments as the JSON text a reply carries: valid, non-standard, deep, huge, not JSON.
ARGUMENT_TEXT = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "path": st.sampled_from(["input/notes.txt", "../x", "/etc/passwd"]) | VALUES,
            "name": st.sampled_from(["report.md", "2.md", "../x", ""]) | VALUES,
            "text": TEXT | VALUES,
        },
    ).map(json.dumps),
    VALUES.map(json.dumps),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e999"]).map(
        lambda n: f'{{"path": {n}}}'
    ),
    st.integers(20, 3000).map(lambda n: f'{{"path": {nested(n)}}}'),
    st.integers(0, 300_000).map(lambda n: json.dumps({"name": "big.md", "text": "x" * n})),
    st.text(max_size=40),
)
NAMES = st.sampled_from(["fetch", "write_artifact", "summarize", "agent", "nope", ""]) | TEXT
CALLS = st.lists(st.tuples(NAMES, ARGUMENT_TEXT), max_size=3)


def openai_body(calls: list[tuple[str, str]], text: Any, usage: Any = None) -> bytes:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": args}}
            for n, (name, args) in enumerate(calls)
        ]
    return json.dumps({"choices": [{"message": message}], "usage": usage}).encode()


def ollama_body(calls: list[tuple[str, str]], text: Any, usage: Any = None) -> bytes:
    """Ollama sends arguments as JSON inside the reply itself: spliced in raw."""
    parts = [f'{{"function": {{"name": {json.dumps(name)}, "arguments": {args}}}}}'
             for name, args in calls]  # fmt: skip
    content = json.dumps(text)
    message = f'{{"role": "assistant", "content": {content}, "tool_calls": [{", ".join(parts)}]}}'
    return f'{{"message": {message}, "prompt_eval_count": {json.dumps(usage)}}}'.encode()


def well_formed(engine: str, calls: list[tuple[str, str]], text: Any) -> tuple[str, bytes, bool]:
    """A reply of the right shape: its turn must commit whatever its calls hold, unless
    its text is not text, or (Ollama, whose arguments sit raw in the reply) the reply
    is not JSON or nests too deeply to decode."""
    body = (openai_body if engine == "openai" else ollama_body)(calls, text, None)
    spliced = engine == "openai" or all(_decodes(a) for _, a in calls)
    return engine, body, isinstance(text, str | None) and spliced


def _decodes(text: str) -> bool:
    """Whether arguments spliced raw into an Ollama reply leave it JSON a decoder reads."""
    if text.count("[") > 900:
        return False  # the reply itself is then too deep to decode: a step_error
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


REPLIES = st.one_of(
    st.builds(well_formed, st.sampled_from(["openai", "ollama"]), CALLS, st.none() | TEXT | VALUES),
    st.tuples(
        st.sampled_from(["openai", "ollama"]),
        VALUES.map(lambda v: json.dumps(v).encode())
        | st.binary(max_size=60)
        | st.integers(500, 5000).map(lambda n: nested(n).encode()),
        st.just(False),
    ),
)

DOCUMENTED = {0, 2}


@contextmanager
def scratch(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp, monkeypatch.context() as patch:
        for name in list(os.environ):
            if name.startswith(("AGENT_", "NINELIVES_", "OLLAMA_")):
                patch.delenv(name)
        for name, value in env.items():
            patch.setenv(name, value)
        patch.chdir(tmp)
        root = Path(tmp)
        (root / "input").mkdir()
        (root / "input" / "notes.txt").write_text("Alpha\nBeta\n", encoding="utf-8")
        (root / "plan.json").write_text(json.dumps(PLAN), encoding="utf-8")
        yield root


def call(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    if code != 0:
        assert err.splitlines()[-1].startswith("ninelives: error: "), err
    return code, out, err


@FUZZ
@given(reply=REPLIES)
def test_any_model_reply(
    reply: tuple[str, bytes, bool], monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    engine, body, must_commit = reply
    with fake_model_server(body, Turn(text="Done.")) as fake:
        url = fake.url + ("/v1" if engine == "openai" else "")
        env = {
            "NINELIVES_LLM": engine,
            "NINELIVES_LLM_URL": url,
            "NINELIVES_LLM_MODEL": "m",
            "AGENT_MAX_ATTEMPTS": "2",
            "NINELIVES_BACKOFF": "0",
        }
        with scratch(monkeypatch, env):
            assert call(capsys, "create", "t", "plan.json")[0] == 0
            code, _, _ = call(capsys, "run", "t", "-q")
            assert code in DOCUMENTED
            _, shown, _ = call(capsys, "export", "t")
            events = [json.loads(line) for line in shown.splitlines()]
            first_turn = [e["kind"] for e in events if e["step"] == 1]
            # The generated reply either committed the turn or was its step_error.
            assert first_turn[1] in ("step_finished", "step_error"), first_turn
            if must_commit:  # its bad calls are call errors, never a failed turn
                assert first_turn[1] == "step_finished", events
            assert call(capsys, "status", "t", "--outputs")[0] == 0
            verify = call(capsys, "verify", "--all", "--artifacts", "artifacts")
            assert verify[0] == 0, verify[1]
