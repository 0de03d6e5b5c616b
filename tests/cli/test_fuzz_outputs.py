"""Fuzzing the outputs that fork, ``resolve --done`` and probes store.

Values a reader could mistake for a blob reference or an escape (dicts whose
only key is ``"$raw"`` or ``"$blob"``, nested, with reference-shaped bodies),
unicode and large ones: each is stored and reads back equal to what was given,
or (``resolve``) is refused with exit 4 and nothing stored; never a traceback,
and ``verify`` is clean afterwards. Commands run in this process on a real
SQLite file in a fresh folder each, derandomized as in ``test_fuzz.py``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fuzz import DOCUMENTED, FUZZ, JSON, NASTY, scratch

from ninelives import cli
from ninelives.store import open_store
from ninelives.testing.lab import SUMMARY_NOTES

#: A fixed budget: every example is a fresh database and a handful of commands.
OUTPUT_FUZZ = settings(FUZZ, max_examples=40)

TOOLS = Path(__file__).parents[1] / "crash" / "output_tools.py"
HEX = st.text("0123456789abcdef", min_size=64, max_size=64)
REF_BODY = st.fixed_dictionaries({"sha256": HEX, "size": st.integers(0, 1 << 40)})
KEYS = st.sampled_from(["$raw", "$blob", "x", "é", "$raw "]) | NASTY
SHAPED = st.recursive(
    JSON | REF_BODY,
    lambda inner: (
        st.builds(lambda v: {"$raw": v}, inner)
        | st.builds(lambda v: {"$blob": v}, inner | REF_BODY)
        | st.dictionaries(KEYS, inner, max_size=3)
        | st.lists(inner, max_size=3)
    ),
    max_leaves=8,
)
LARGE = st.integers(0, 100_000).map(lambda n: {"$raw": {"big": "ü✓" * n}})
#: Outputs: JSON objects a tool, a person or a probe could give.
OUTPUTS = (
    st.builds(lambda v: {"$raw": v}, SHAPED)
    | st.builds(lambda v: {"$blob": v}, SHAPED | REF_BODY)
    | st.dictionaries(KEYS, SHAPED, max_size=3)
    | LARGE
)
#: What ``resolve --done`` may be given: outputs, other JSON, and text that is not.
DONE_TEXT = (
    OUTPUTS.map(json.dumps)
    | JSON.map(json.dumps)
    | NASTY
    | st.integers(1, 3000).map(lambda n: "[" * n + "]" * n)
    | st.integers(1, 3000).map(lambda n: '{"$raw": ' * n + "{}" + "}" * n)
    | st.sampled_from(["NaN", '{"x": NaN}', '{"x": 1e999}', "", "{", '"\\ud800"'])
)
THRESHOLDS = st.sampled_from(["0", "65536"])  # every output a blob, or only the large


def call(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``ninelives ARGS`` in this process: (exit code, stdout, stderr), checked:
    a documented code (8: the task waits for a person), one line on error."""
    capsys.readouterr()
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    assert code in DOCUMENTED | {8}, (args, code, err)
    assert "Traceback" not in err, err
    if code != 0:
        assert err.splitlines()[-1].startswith("ninelives: error: "), err
        if args[0] != "run":  # run prints progress lines before its error
            assert err.count("\n") == 1, err
    return code, out, err


def verify_clean(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = call(capsys, "verify", "--all", "--artifacts", "artifacts")
    assert code == 0, out


def _plan(tool: str, **step_input: Any) -> str:
    return json.dumps({"goal": "store", "steps": [{"tool": tool, "input": step_input}]})


def _setup(root: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any, plan: str) -> int:
    shutil.copy(TOOLS, root / "output_tools.py")
    monkeypatch.setenv("NINELIVES_TOOLS", "output_tools")
    (root / "plan.json").write_text(plan, encoding="utf-8")
    return call(capsys, "create", "t", "plan.json")[0]


def _outputs(capsys: Any, task_id: str) -> list[Any]:
    code, shown, _ = call(capsys, "status", task_id, "--json", "--outputs")
    assert code == 0
    return [step.get("output") for step in json.loads(shown)["steps"]]


def _left_running(task_id: str = "t") -> None:
    """Step 0 committed ``running`` by a run that then died, as a SIGKILL leaves it."""
    store = open_store("state.db")
    try:
        run, _ = store.begin_run(task_id, "killed", start_first=True)
        assert run.started is not None
        store.end_run(run)
    finally:
        store.close()


@OUTPUT_FUZZ
@given(output=OUTPUTS, threshold=THRESHOLDS)
def test_fork_copies_any_output(
    output: dict[str, Any], threshold: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    with scratch(monkeypatch, {"NINELIVES_BLOB_THRESHOLD": threshold}) as root:
        steps = [{"tool": "echo", "input": {"output": output}},
                 {"tool": "echo", "input": {"output": {}}}]  # fmt: skip
        plan = json.dumps({"goal": "fork", "steps": steps})
        code = _setup(root, monkeypatch, capsys, plan)
        assert code in (0, 4)  # a plan too deep or too large is refused at create
        if code == 4:
            return
        assert call(capsys, "run", "t", "-q")[0] == 0
        assert _outputs(capsys, "t")[0] == output
        assert call(capsys, "fork", "t", "f", "--from", "1")[0] == 0
        assert _outputs(capsys, "f")[0] == output
        assert call(capsys, "run", "f", "-q")[0] == 0
        assert _outputs(capsys, "f") == [output, {}]
        verify_clean(capsys)


@OUTPUT_FUZZ
@given(text=DONE_TEXT)
def test_resolve_done_stores_any_output_as_given(
    text: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    with scratch(monkeypatch) as root:
        assert _setup(root, monkeypatch, capsys, _plan("refused")) == 0
        _left_running()
        assert call(capsys, "run", "t", "-q")[0] == 8  # refuse: blocked
        before = (call(capsys, "export", "t")[1], _outputs(capsys, "t"))
        code, _, _ = call(capsys, "resolve", "t", "0", f"--done={text}")
        assert code in (0, 4)
        if code == 0:
            assert _outputs(capsys, "t") == [json.loads(text)]
        else:
            assert (call(capsys, "export", "t")[1], _outputs(capsys, "t")) == before
        verify_clean(capsys)


@OUTPUT_FUZZ
@given(answer=OUTPUTS | JSON)
def test_a_probe_answer_is_stored_as_given(
    answer: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """A probe's answer that is an object is committed as the step's output and
    reads back equal; ``null`` (not done) runs the step again; any other answer
    blocks the task (exit 8), nothing stored."""
    with scratch(monkeypatch) as root:
        assert (root / "input" / "notes.txt").read_text(encoding="utf-8") == SUMMARY_NOTES
        assert _setup(root, monkeypatch, capsys, _plan("probed")) == 0
        (root / "probe-answer.json").write_text(json.dumps(answer), encoding="utf-8")
        _left_running()
        code = call(capsys, "run", "t", "-q")[0]
        if isinstance(answer, dict):
            assert code == 0
            assert _outputs(capsys, "t") == [answer]
        elif answer is None:
            assert code == 0
            assert _outputs(capsys, "t") == [{"ran": "t-0"}]
        else:
            assert code == 8
            assert _outputs(capsys, "t") == [None]
        verify_clean(capsys)
