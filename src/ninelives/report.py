"""``ninelives report``: one task's history as a self-contained HTML page.

The page needs no network and no script: an inline SVG timeline with one lane
per process run (``create``, ``run 1``, ...), each step attempt a bar from its
start to its end, or to the last event of its run when the process was killed
under it; recoveries and the other journal events are marks on their lane.
Below: a summary (kills, recoveries, model calls and tokens), the artifacts
produced, the steps and the whole journal. Every string that comes from the
database is escaped, and a Content-Security-Policy forbids scripts outright.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

from .humanize import duration, html_text
from .journal import calls_models, model_usage
from .models import Event, EventKind, StepStatus, Task

_WIDTH = 960  # px of the timeline's drawing area
_LABEL = 110  # px of the lane labels left of it
_LANE = 34  # px per lane
_ELIDE = 160  # characters of a value shown in a table cell
_ENDS = (EventKind.STEP_FINISHED.value, EventKind.STEP_ERROR.value)


@dataclass(frozen=True)
class Attempt:
    """One step attempt as drawn: ``end`` None when no event closed it (killed)."""

    step: int
    tool: str
    attempt: int | None
    start: float
    end: float | None
    error: str | None


@dataclass(frozen=True)
class Lane:
    """One process's events: the ``create`` or a ``run N``."""

    name: str
    run_id: str
    events: tuple[Event, ...]
    attempts: tuple[Attempt, ...]

    @property
    def start(self) -> float:
        return self.events[0].ts

    @property
    def end(self) -> float:
        return self.events[-1].ts


def lanes(events: Sequence[Event]) -> list[Lane]:
    """The journal split by run, in order, with each run's step attempts paired up."""
    by_run: dict[str, list[Event]] = {}
    for event in events:
        by_run.setdefault(event.run_id, []).append(event)
    found, number = [], 0
    for run_id, run_events in by_run.items():
        created = run_events[0].kind == EventKind.TASK_CREATED.value
        number += not created
        found.append(
            Lane(
                name="create" if created else f"run {number}",
                run_id=run_id,
                events=tuple(run_events),
                attempts=tuple(_attempts(run_events)),
            )
        )
    return found


def _attempts(events: Sequence[Event]) -> list[Attempt]:
    done: list[Attempt] = []
    open_: dict[int, Event] = {}
    for event in events:
        idx = event.step_idx
        if idx is None:
            continue
        if event.kind == EventKind.STEP_STARTED.value:
            open_[idx] = event
        elif event.kind in _ENDS and idx in open_:
            done.append(_attempt(open_.pop(idx), event))
    done.extend(_attempt(started, None) for started in open_.values())
    return sorted(done, key=lambda a: a.start)


def _attempt(started: Event, ended: Event | None) -> Attempt:
    attempt = started.data.get("attempt")
    error = None
    if ended is not None and ended.kind == EventKind.STEP_ERROR.value:
        error = str(ended.data.get("error", "error"))
    return Attempt(
        step=started.step_idx if started.step_idx is not None else -1,
        tool=str(started.data.get("tool", "?")),
        attempt=attempt if isinstance(attempt, int) else None,
        start=started.ts,
        end=ended.ts if ended is not None else None,
        error=error,
    )


def _e(value: object) -> str:
    return html_text(value)


def _elide(text: str, limit: int = _ELIDE) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def render(task: Task, events: Sequence[Event], *, version: str) -> str:
    """The report page of ``task`` with its journal ``events``, as HTML text."""
    runs = lanes(events)
    attempts = [a for lane in runs for a in lane.attempts]
    killed = sum(a.end is None for a in attempts)
    recovered = sum(e.kind == EventKind.STEP_RECOVERED.value for e in events)
    done = sum(s.status is StepStatus.DONE for s in task.steps)
    facts = [
        ("status", task.status.value),
        ("steps done", f"{done} of {len(task.steps)}"),
        ("process runs", str(sum(lane.name != "create" for lane in runs))),
        ("attempts killed", str(killed)),
        ("steps recovered", str(recovered)),
        ("created", _when(task.created_at) + " UTC"),
        ("last change", _when(task.updated_at) + " UTC"),
    ]
    if calls_models(task):
        usage = model_usage(task, events)
        tokens = usage["tokens"]
        facts.append(("model calls", str(usage["model_calls"])))
        facts.append(("tokens in / out", f"{tokens['input_tokens']} / {tokens['output_tokens']}"))
        facts.append(("model calls saved by resuming", str(usage["model_calls_saved"])))
    parts = [
        _HEAD.format(title=_e(f"ninelives report: {task.id}")),
        f'<h1>Task <code>{_e(task.id)}</code> <span class="status s-{_e(task.status.value)}">'
        f"{_e(task.status.value)}</span></h1>",
        f'<p class="goal">{_e(task.goal)}</p>',
        '<dl class="facts">',
        *(f"<div><dt>{_e(k)}</dt><dd>{_e(v)}</dd></div>" for k, v in facts),
        "</dl>",
        "<h2>Timeline</h2>",
        _timeline(runs, _model_notes(task)),
        _legend(),
        _artifacts(task),
        _steps(task),
        _journal(events, runs),
        f"<footer>ninelives {_e(version)}; times are UTC.</footer></main></body></html>",
    ]
    return "\n".join(parts)


class _Axis:
    """Time to x: each stretch when some process was running gets width in
    proportion to its length (at least :data:`_MIN_ACTIVE` px); each idle gap
    between them (no process left a trace: the task waited, or was down) is drawn
    :data:`_GAP` px wide with its length written on it, so that a run of 5 ms
    after a restart an hour later stays visible."""

    def __init__(self, runs: Sequence[Lane]) -> None:
        merged: list[list[float]] = []
        for start, end in sorted((lane.start, lane.end) for lane in runs):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        self.active = [(a, b) for a, b in merged]
        self.gaps = [(self.active[i][1], self.active[i + 1][0]) for i in range(len(merged) - 1)]
        room = _WIDTH - _GAP * len(self.gaps) - _MIN_ACTIVE * len(self.active)
        total = sum(b - a for a, b in self.active) or 1.0
        self.widths = [_MIN_ACTIVE + max(room, 0) * (b - a) / total for a, b in self.active]

    def x(self, ts: float) -> float:
        left = float(_LABEL)
        for i, (a, b) in enumerate(self.active):
            if ts <= b or i == len(self.active) - 1:
                fraction = (ts - a) / (b - a) if b > a else 0.0
                return left + min(max(fraction, 0.0), 1.0) * self.widths[i]
            left += self.widths[i]
            if ts < self.active[i + 1][0]:
                return left + _GAP / 2  # inside an idle gap (not drawn there)
            left += _GAP
        return left

    def gap_marks(self, height: int) -> list[str]:
        out, left = [], float(_LABEL)
        for i, (a, b) in enumerate(self.gaps):
            left += self.widths[i]
            out.append(
                f'<g class="gap"><title>{_e(f"no process for {duration(b - a)}")}</title>'
                f'<rect x="{left:.1f}" y="0" width="{_GAP}" height="{height - 20}"></rect>'
                f'<text x="{left + _GAP / 2:.1f}" y="{height - 4}" text-anchor="middle">'
                f"{_e(duration(b - a))}</text></g>"
            )
            left += _GAP
        return out


_GAP = 44
_MIN_ACTIVE = 90


def _model_notes(task: Task) -> dict[int, str]:
    """For each done step that called a model, its tokens and latency (for its bar)."""
    notes = {}
    for step in task.steps:
        usage = (step.output or {}).get("usage")
        if step.status is StepStatus.DONE and isinstance(usage, dict):
            ms = (step.output or {}).get("ms")
            notes[step.idx] = (
                f"model turn: {usage.get('input_tokens', '?')} tokens in, "
                f"{usage.get('output_tokens', '?')} out"
                + (f", {ms} ms" if isinstance(ms, (int, float)) else "")
            )
    return notes


def _timeline(runs: Sequence[Lane], notes: Mapping[int, str]) -> str:
    if not runs:
        return "<p>The journal is empty.</p>"
    axis = _Axis(runs)
    height = _LANE * len(runs) + 24
    out = [
        f'<svg class="timeline" role="img" aria-label="one lane per process run" '
        f'viewBox="0 0 {_LABEL + _WIDTH + 20} {height}" width="100%">'
    ]
    for row, lane in enumerate(runs):
        y = row * _LANE + 4
        out.append(
            f'<rect class="lane-bg" x="0" y="{y}" width="{_LABEL + _WIDTH + 20}" '
            f'height="{_LANE - 4}"></rect>'
            f'<text class="lane-label" x="6" y="{y + 20}">{_e(lane.name)}</text>'
        )
    # Gaps over the lanes' backgrounds, under the bars: a killed attempt's bar
    # reaches into the gap that follows it (the process died somewhere in there).
    out.extend(axis.gap_marks(height))
    for row, lane in enumerate(runs):
        y = row * _LANE + 4
        out.append(f'<g class="lane" data-run="{_e(lane.run_id)}" data-name="{_e(lane.name)}">')
        out.extend(_bar(a, axis.x, y, lane.end, notes) for a in lane.attempts)
        marks = [e for e in lane.events if e.kind not in (EventKind.STEP_STARTED.value, *_ENDS)]
        # Recoveries last, so that they are drawn over the run's other marks.
        marks.sort(key=lambda e: e.kind == EventKind.STEP_RECOVERED.value)
        out.extend(_mark(e, axis.x(e.ts), y) for e in marks)
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


def _bar(a: Attempt, x: Any, y: int, lane_end: float, notes: Mapping[int, str]) -> str:
    end = a.end if a.end is not None else lane_end
    left = x(a.start)
    width = max(x(end) - left, 14.0 if a.end is None else 4.0)
    if a.end is None:
        kind, outcome = "killed", "no end recorded: killed (or still running)"
    elif a.error is not None:
        kind, outcome = "error", f"error: {_elide(a.error)}"
    else:
        kind, outcome = "done", "finished"
        if a.step in notes:
            outcome += f"; {notes[a.step]}"
    title = (
        f"step {a.step} {a.tool}, attempt {a.attempt if a.attempt is not None else '?'}, "
        f"{duration(end - a.start)}, {outcome}"
    )
    label = f"{a.step} {a.tool}" + (" ✕ killed" if a.end is None else "")
    # A label that does not fit its bar goes after it, in the text colour.
    inside = len(label) * 6.5 + 6 < width
    text_x = left + 3 if inside else left + width + 3
    return (
        f'<g class="attempt {kind}" data-step="{a.step}"><title>{_e(title)}</title>'
        f'<rect x="{left:.1f}" y="{y + 5}" width="{width:.1f}" height="{_LANE - 14}" rx="3">'
        f"</rect>"
        f'<text class="{"in" if inside else "out"}" x="{text_x:.1f}" y="{y + 20}">'
        f"{_e(label)}</text></g>"
    )


_MARKS = {
    EventKind.STEP_RECOVERED.value: "recovered",
    EventKind.RUN_STARTED.value: "run",
    EventKind.TASK_CREATED.value: "run",
    EventKind.TASK_DONE.value: "done",
    EventKind.TASK_FAILED.value: "failed",
    EventKind.TASK_CANCELLED.value: "failed",
    EventKind.STEP_REJECTED.value: "failed",
    EventKind.STEP_RECONCILED.value: "done",
    EventKind.STEP_APPROVED.value: "done",
    EventKind.STEP_RESOLVED.value: "done",
    EventKind.STEP_BLOCKED.value: "parked",
    EventKind.STEP_WAITING.value: "parked",
}


def _mark(event: Event, at: float, y: int) -> str:
    kind = _MARKS.get(event.kind, "other")
    step = f" step {event.step_idx}" if event.step_idx is not None else ""
    data = json.dumps(event.data, sort_keys=True, ensure_ascii=False)
    title = f"#{event.seq} {event.kind}{step} {_elide(data)}"
    if kind == "recovered":  # a larger triangle up from the lane's bottom edge
        base, tip = y + _LANE - 4, y + _LANE - 16
        points = f"{at:.1f},{tip} {at + 7:.1f},{base} {at - 7:.1f},{base}"
    else:  # a small one down from the top edge
        points = f"{at:.1f},{y + 8} {at + 5:.1f},{y + 1} {at - 5:.1f},{y + 1}"
    return (
        f'<g class="mark {kind}" data-kind="{_e(event.kind)}"><title>{_e(title)}</title>'
        f'<polygon points="{points}"></polygon></g>'
    )


def _legend() -> str:
    items = [
        ("attempt done", "done"), ("attempt failed", "error"),
        ("killed under the attempt", "killed"), ("recovery", "recovered"),
        ("other event", "other"),
    ]  # fmt: skip
    cells = "".join(f'<li><span class="key {c}"></span>{_e(t)}</li>' for t, c in items)
    return f'<ul class="legend">{cells}</ul>'


def _artifacts(task: Task) -> str:
    rows = []
    for step in task.steps:
        out = step.output or {}
        path = out.get("path")
        if step.status is StepStatus.DONE and isinstance(path, str) and "sha256" in out:
            folder = task.artifacts or os.getcwd()
            target = os.path.join(folder, os.path.basename(path))
            href = "file://" + quote(target)
            size = out.get("bytes", "?")
            rows.append(
                f'<tr><td>{step.idx}</td><td><a class="artifact" href="{_e(href)}">'
                f"{_e(path)}</a></td><td>{_e(size)}</td>"
                f"<td><code>{_e(str(out['sha256'])[:16])}…</code></td></tr>"
            )
    if not rows:
        return "<h2>Artifacts</h2><p>None published.</p>"
    head = "<tr><th>step</th><th>path</th><th>bytes</th><th>sha256</th></tr>"
    return f'<h2>Artifacts</h2><table class="artifacts">{head}{"".join(rows)}</table>'


def _steps(task: Task) -> str:
    head = "<tr><th>step</th><th>tool</th><th>status</th><th>attempts</th><th>output</th></tr>"
    rows = []
    for s in task.steps:
        output = "" if s.output is None else json.dumps(s.output, ensure_ascii=False)
        rows.append(
            f'<tr class="s-{_e(s.status.value)}"><td>{s.idx}</td><td>{_e(s.tool)}</td>'
            f"<td>{_e(s.status.value)}</td><td>{s.attempts}</td>"
            f"<td><code>{_e(_elide(output))}</code></td></tr>"
        )
    return f'<h2>Steps</h2><table class="steps">{head}{"".join(rows)}</table>'


def _journal(events: Sequence[Event], runs: Sequence[Lane]) -> str:
    names = {lane.run_id: lane.name for lane in runs}
    t0 = events[0].ts if events else 0.0
    head = "<tr><th>seq</th><th>+s</th><th>run</th><th>kind</th><th>step</th><th>data</th></tr>"
    rows = []
    for e in events:
        data = json.dumps(e.data, sort_keys=True, ensure_ascii=False)
        rows.append(
            f'<tr class="k-{_e(e.kind)}"><td>{e.seq}</td><td>{e.ts - t0:.3f}</td>'
            f"<td>{_e(names.get(e.run_id, '?'))}</td><td>{_e(e.kind)}</td>"
            f"<td>{'' if e.step_idx is None else e.step_idx}</td>"
            f"<td><code>{_e(_elide(data))}</code></td></tr>"
        )
    return f'<h2>Journal</h2><table class="journal">{head}{"".join(rows)}</table>'


_HEAD = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
 content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
:root {{ --bg:#fff; --fg:#1d232a; --muted:#5b6570; --lane:#f1f3f5; --line:#d5dbe1;
  --done:#2f9e44; --error:#e8890c; --killed:#d6336c; --recovered:#1c7ed6; --other:#868e96; }}
@media (prefers-color-scheme: dark) {{
  :root {{ --bg:#15191e; --fg:#e3e7eb; --muted:#9aa5b1; --lane:#20262d; --line:#343c45;
    --done:#51cf66; --error:#ffa94d; --killed:#f06595; --recovered:#4dabf7; --other:#adb5bd; }}
}}
body {{ background:var(--bg); color:var(--fg); margin:0;
  font:14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; }}
main {{ max-width:1120px; margin:0 auto; padding:24px; }}
h1 {{ font-size:22px; margin:0 0 4px; }} h2 {{ font-size:17px; margin:28px 0 8px; }}
code {{ font-family:ui-monospace, "SF Mono", Menlo, monospace; font-size:12px;
  overflow-wrap:anywhere; }}
.goal {{ color:var(--muted); margin:0 0 12px; white-space:pre-wrap; }}
.status {{ font-size:13px; padding:2px 8px; border-radius:10px; border:1px solid var(--line); }}
.facts {{ display:flex; flex-wrap:wrap; gap:8px 28px; margin:0; }}
.facts dt {{ color:var(--muted); font-size:12px; }} .facts dd {{ margin:0; font-weight:600; }}
.timeline {{ display:block; border:1px solid var(--line); border-radius:6px; }}
.lane-bg {{ fill:var(--lane); }} .lane-label, .axis {{ fill:var(--muted); font-size:12px; }}
.attempt text {{ font-size:11px; pointer-events:none; }}
.attempt text.in {{ fill:var(--bg); }} .attempt text.out {{ fill:var(--fg); }}
.gap rect {{ fill:var(--bg); }} .gap text {{ fill:var(--muted); font-size:11px; }}
.attempt.done rect {{ fill:var(--done); }} .attempt.error rect {{ fill:var(--error); }}
.attempt.killed rect {{ fill:var(--killed); opacity:.8; }}
.mark polygon {{ fill:var(--other); }}
.mark.recovered polygon {{ fill:var(--recovered); stroke:var(--bg); stroke-width:1; }}
.mark.failed polygon {{ fill:var(--killed); }} .mark.done polygon {{ fill:var(--done); }}
.mark.parked polygon {{ fill:var(--error); }}
.legend {{ list-style:none; padding:0; display:flex; gap:18px; color:var(--muted); }}
.key {{ display:inline-block; width:12px; height:12px; border-radius:2px; margin-right:6px;
  vertical-align:-1px; }}
.key.done {{ background:var(--done); }} .key.error {{ background:var(--error); }}
.key.killed {{ background:var(--killed); }} .key.recovered {{ background:var(--recovered); }}
.key.other {{ background:var(--other); }}
table {{ border-collapse:collapse; width:100%; }}
th, td {{ text-align:left; padding:4px 8px; border-bottom:1px solid var(--line);
  vertical-align:top; }}
th {{ color:var(--muted); font-weight:600; font-size:12px; }}
a {{ color:var(--recovered); }}
footer {{ color:var(--muted); font-size:12px; margin-top:28px; }}
@media print {{
  :root {{ --bg:#fff; --fg:#000; --lane:#f3f3f3; --line:#bbb; }}
  main {{ max-width:none; padding:0; }} tr, .timeline {{ break-inside:avoid; }}
}}
</style></head><body><main>"""
