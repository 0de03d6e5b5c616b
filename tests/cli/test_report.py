"""``ninelives report``: the page loaded in a real headless Chromium.

For a task killed twice and resumed, the DOM the browser built holds a lane per
process, a bar per attempt (two of them killed), a mark per recovery and a link
to the artifact; a hostile goal stays text. The screenshot is kept as an
artefact of the test (``NINELIVES_SCREENSHOTS=DIR`` keeps it there; the docs'
picture was made so).
"""

from __future__ import annotations

import html
import os
import re
import shutil
from pathlib import Path

import pytest

import browser
from ninelives.testing import Lab

HOSTILE = (
    "<script>document.documentElement.setAttribute('data-pwned','1')</script>"
    '<img src=x onerror="document.title=\'pwned\'"> & "quotes"'
)


def _killed_twice(lab: Lab) -> None:
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    assert lab.cli("run", "t", AGENT_CRASH_AT="after_effect:1").returncode == -9
    assert lab.cli("run", "t", AGENT_CRASH_AT="before_effect:2").returncode == -9
    assert lab.cli("run", "t").returncode == 0


def _classes(dom: str, cls: str) -> list[str]:
    """The opening tags in ``dom`` whose class attribute is exactly ``cls``."""
    return re.findall(rf'<[a-z]+ class="{re.escape(cls)}"[^>]*>', dom)


def _goal_html(dom: str) -> str:
    found = re.search(r'<p class="goal">(.*?)</p>', dom, re.S)
    assert found is not None, "no goal paragraph"
    return found.group(1)


def test_the_report_of_a_task_killed_twice_shows_both_kills_and_recoveries(
    lab: Lab, tmp_path: Path
) -> None:
    _killed_twice(lab)
    made = lab.cli("report", "t", "-o", "report.html")
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("wrote report.html (")
    page = lab.root / "report.html"
    dom = browser.dom(page.as_uri())
    lanes = re.findall(r'<g class="lane" data-run="[0-9a-f]+" data-name="([^"]+)"', dom)
    assert lanes == ["create", "run 1", "run 2", "run 3"]
    assert len(_classes(dom, "attempt killed")) == 2
    assert len(_classes(dom, "attempt done")) == 3
    assert len(_classes(dom, "mark recovered")) == 2
    assert "1 summarize ✕ killed" in dom
    assert "2 write_artifact ✕ killed" in dom
    [link] = re.findall(r'<a class="artifact" href="([^"]+)">([^<]+)</a>', dom)
    assert link[1] == "artifacts/t-2.md"
    target = Path(html.unescape(link[0]).removeprefix("file://"))
    assert target == lab.artifacts_dir / "t-2.md"
    assert target.read_text() == (lab.artifacts_dir / "t-2.md").read_text()
    facts = dict(re.findall(r"<dt>([^<]+)</dt><dd>([^<]+)</dd>", dom))
    assert facts["attempts killed"] == "2"
    assert facts["steps recovered"] == "2"
    assert facts["process runs"] == "3"
    assert dom.count('<tr class="k-') == len(lab.cli("export", "t").jsonl())
    shot = browser.screenshot(page.as_uri(), tmp_path / "report.png", height=640)
    keep = os.environ.get("NINELIVES_SCREENSHOTS")
    if keep:
        shutil.copy(shot, Path(keep) / "report.png")


def test_a_hostile_goal_is_text_and_never_runs(lab: Lab) -> None:
    lab.write("notes.txt", "n\n")
    lab.write_plan({"goal": HOSTILE, "steps": [{"tool": "fetch", "input": {"path": "notes.txt"}}]})
    assert lab.cli("create", "t", "plan.json").returncode == 0
    assert lab.cli("run", "t").returncode == 0
    assert lab.cli("report", "t").returncode == 0  # report-t.html, the default name
    dom = browser.dom((lab.root / "report-t.html").as_uri())
    assert "data-pwned" not in dom.split("<body", 1)[0]
    assert "<title>pwned" not in dom
    inner = _goal_html(dom)
    assert "<" not in inner  # no element inside: the goal is text
    assert html.unescape(inner) == HOSTILE


def test_a_goal_that_would_reorder_or_act_is_shown_escaped(lab: Lab) -> None:
    # A right-to-left override shows "pay \u202e01$ ot" as "pay to $10"; a BEL is
    # not text. Both reached the file raw; a newline is laid out, not escaped.
    lab.write("notes.txt", "n\n")
    goal = "pay \u202e01$ ot\x07\nmore"
    lab.write_plan({"goal": goal, "steps": [{"tool": "fetch", "input": {"path": "notes.txt"}}]})
    assert lab.cli("create", "t", "plan.json").returncode == 0
    assert lab.cli("report", "t").returncode == 0
    page = (lab.root / "report-t.html").read_text(encoding="utf-8")
    assert not set("\u202e\x07") & set(page)
    assert "pay \\u202e01$ ot\\x07\nmore" in page


def test_negative_control_an_unescaped_goal_would_be_markup(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The check above fails when the page does not escape: rendered without it,
    # the goal's <script> and <img> become elements of the page.
    from ninelives import report, runtime

    lab.write("notes.txt", "n\n")
    lab.write_plan({"goal": HOSTILE, "steps": [{"tool": "fetch", "input": {"path": "notes.txt"}}]})
    assert lab.cli("create", "t", "plan.json").returncode == 0
    monkeypatch.setattr(report, "_e", str)
    with runtime.open(lab.db if "://" in lab.db else str(lab.root / lab.db), create=False) as rt:
        page = report.render(rt.status("t"), rt.export("t"), version="x")
    (lab.root / "unescaped.html").write_text(page)
    inner = _goal_html(browser.dom((lab.root / "unescaped.html").as_uri()))
    assert "<script>" in inner
    assert "<img" in inner


@pytest.mark.slow
def test_report_to_stdout_and_its_errors(lab: Lab) -> None:
    _killed_twice(lab)
    out = lab.cli("report", "t", "-o", "-")
    assert out.returncode == 0
    assert out.stdout.startswith("<!DOCTYPE html>")
    assert "Content-Security-Policy" in out.stdout
    assert "http://" not in out.stdout  # no network: nothing to fetch
    assert "https://" not in out.stdout
    assert lab.cli("report", "nope").returncode == 1
    missing = lab.cli("report", "t", "-o", "no/such/folder/r.html")
    assert missing.returncode == 10
    assert missing.stderr.count("\n") == 1
    assert "cannot write no/such/folder/r.html" in missing.stderr
    assert lab.cli("report", "../x").returncode == 4


def test_model_turns_show_their_tokens_and_latency(lab: Lab) -> None:
    lab.write("notes.txt", "some notes\n")
    lab.write_plan({"goal": "g", "steps": [
        {"tool": "fetch", "input": {"path": "notes.txt"}},
        {"tool": "llm", "input": {"prompt": "summarize", "from": 0}},
    ]})  # fmt: skip
    assert lab.cli("create", "t", "plan.json").returncode == 0
    assert lab.cli("run", "t").returncode == 0
    assert lab.cli("report", "t").returncode == 0
    dom = browser.dom((lab.root / "report-t.html").as_uri())
    assert re.search(r"<title>step 1 llm, attempt 1, [^<]*model turn: \d+ tokens in, \d+ out", dom)
    facts = dict(re.findall(r"<dt>([^<]+)</dt><dd>([^<]+)</dd>", dom))
    assert facts["model calls"] == "1"
