"""A task's journal in other shapes: CSV rows, and OTLP/JSON traces.

``ninelives export --format otlp-json`` turns one task into one trace that
Jaeger, Grafana Tempo or Honeycomb read (an OTLP ``ExportTraceServiceRequest``
in its JSON encoding): the task is the root span, each process run a child
span, each step attempt a child of its run with its outcome as the span
status, and each recovery a span event on the run that found it. Ids are
derived from the task id and the run id, so exporting the same task twice
gives the same trace and span ids (a collector deduplicates them).

Pure functions of the stored rows: nothing here reads a clock or a file.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from .journal import printable_json
from .models import Event, EventKind, Task

#: The export formats ``ninelives export --format`` accepts.
FORMATS = ("jsonl", "csv", "otlp-json")
#: The CSV header: the export's fixed keys, then the rest of the event as JSON.
CSV_COLUMNS = ("seq", "ts", "run", "kind", "step", "data")

# OTLP enum values (opentelemetry/proto/trace/v1/trace.proto).
_SPAN_KIND_INTERNAL = 1
_STATUS_OK = 1
_STATUS_ERROR = 2
_SCOPE = "ninelives"
#: The range of OTLP's ``intValue`` (an int64).
_INT64 = (-(2**63), 2**63 - 1)


def csv_lines(events: Iterable[Event]) -> Iterator[str]:
    """The journal as CSV lines (header first), without line ends; ``data`` is JSON."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="")
    for row in [CSV_COLUMNS, *(_csv_row(e) for e in events)]:
        writer.writerow(row)
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()


def _csv_row(event: Event) -> tuple[Any, ...]:
    step = "" if event.step_idx is None else event.step_idx
    # Strict JSON: a NaN an older version stored is null, as in the JSON Lines export.
    data = printable_json(event.data, sort_keys=True)
    return (event.seq, repr(event.ts), event.run_id, event.kind, step, data)


def trace_id(task_id: str) -> str:
    """The task's trace id: 32 hex digits derived from its id (stable across exports)."""
    return hashlib.sha256(f"ninelives task {task_id}".encode()).hexdigest()[:32]


def _span_id(*parts: object) -> str:
    text = "\x1f".join(str(p) for p in parts)
    return hashlib.sha256(f"ninelives span {text}".encode()).hexdigest()[:16]


def _nanos(ts: float) -> str:
    # int64 fields are strings in OTLP/JSON (the proto3 JSON mapping of 64-bit ints).
    return str(round(ts * 1_000_000_000))


def _attr(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int) and _INT64[0] <= value <= _INT64[1]:
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, int):  # past int64, which a collector refuses to parse: its digits
        return {"key": key, "value": {"stringValue": str(value)}}
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    if not isinstance(value, str):
        value = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return {"key": key, "value": {"stringValue": value}}


def _span(
    span_id: str,
    parent: str | None,
    name: str,
    start: float,
    end: float,
    *,
    trace: str,
    attributes: Sequence[dict[str, Any]] = (),
    events: Sequence[dict[str, Any]] = (),
    status: tuple[int, str] | None = None,
) -> dict[str, Any]:
    span: dict[str, Any] = {
        "traceId": trace,
        "spanId": span_id,
        "name": name,
        "kind": _SPAN_KIND_INTERNAL,
        "startTimeUnixNano": _nanos(start),
        "endTimeUnixNano": _nanos(max(start, end)),
        "attributes": list(attributes),
    }
    if parent is not None:
        span["parentSpanId"] = parent
    if events:
        span["events"] = list(events)
    if status is not None:
        code, message = status
        span["status"] = {"code": code, "message": message} if message else {"code": code}
    return span


def otlp_request(task: Task, events: Sequence[Event], *, version: str) -> dict[str, Any]:
    """The task as one OTLP/JSON ``ExportTraceServiceRequest`` (one trace).

    Span and trace ids are hex strings, as OTLP/JSON requires (not base64).
    A step attempt with no end in the journal (the process was killed under it)
    ends where its run's last event is, with an error status saying so.
    """
    trace = trace_id(task.id)
    root = _span_id(task.id)
    runs: dict[str, list[Event]] = {}
    for event in events:
        runs.setdefault(event.run_id, []).append(event)
    spans: list[dict[str, Any]] = []
    number = 0
    for run_id, run_events in runs.items():
        # The process that created the task journals with a run id of its own.
        created = run_events[0].kind == EventKind.TASK_CREATED.value
        number += not created
        name = "create" if created else f"run {number}"
        spans.extend(_run_spans(task.id, trace, root, name, run_id, run_events))
    start = events[0].ts if events else task.created_at
    end = events[-1].ts if events else task.updated_at
    spans.insert(
        0,
        _span(
            root, None, f"task {task.id}", start, end, trace=trace,
            attributes=[
                _attr("ninelives.task", task.id),
                _attr("ninelives.goal", task.goal),
                _attr("ninelives.status", task.status.value),
                _attr("ninelives.steps", len(task.steps)),
                _attr("ninelives.runs", len(runs)),
            ],
            status=_task_status(task.status.value),
        ),
    )  # fmt: skip
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [_attr("service.name", "ninelives")]},
                "scopeSpans": [{"scope": {"name": _SCOPE, "version": version}, "spans": spans}],
            }
        ]
    }


def _task_status(status: str) -> tuple[int, str] | None:
    if status == "done":
        return (_STATUS_OK, "")
    if status in ("failed", "cancelled"):
        return (_STATUS_ERROR, status)
    return None  # unfinished: unset


def _run_spans(
    task_id: str, trace: str, root: str, name: str, run_id: str, events: Sequence[Event]
) -> list[dict[str, Any]]:
    """The run's span, with a child span per step attempt it started."""
    run_span = _span_id(task_id, run_id)
    last = events[-1].ts
    marks: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    open_: dict[int, Event] = {}  # step idx -> its step_started, until closed
    for event in events:
        idx = event.step_idx
        if event.kind == EventKind.STEP_STARTED.value and idx is not None:
            open_[idx] = event
        elif idx is not None and idx in open_ and event.kind in _ENDS:
            started = open_.pop(idx)
            steps.append(_attempt_span(task_id, trace, run_span, started, event))
        elif event.kind not in (EventKind.STEP_STARTED.value, *_ENDS):
            marks.append(_mark(event))
    for started in open_.values():  # killed (or still running) under this attempt
        steps.append(_attempt_span(task_id, trace, run_span, started, None, end=last))
    run = _span(
        run_span, root, name, events[0].ts, last, trace=trace,
        attributes=[_attr("ninelives.run", run_id)], events=marks,
        status=(_STATUS_ERROR, "the run ended without finishing its step") if open_ else None,
    )  # fmt: skip
    return [run, *steps]


_ENDS = (EventKind.STEP_FINISHED.value, EventKind.STEP_ERROR.value)


def _attempt_span(
    task_id: str,
    trace: str,
    run_span: str,
    started: Event,
    ended: Event | None,
    *,
    end: float | None = None,
) -> dict[str, Any]:
    idx = started.step_idx
    attempt = started.data.get("attempt")
    tool = str(started.data.get("tool", "?"))
    attributes = [_attr("ninelives.step", idx), _attr("ninelives.tool", tool)]
    if isinstance(attempt, int):
        attributes.append(_attr("ninelives.attempt", attempt))
    if ended is None:
        status = (_STATUS_ERROR, "no end recorded: the process was killed or is still running")
    elif ended.kind == EventKind.STEP_ERROR.value:
        status = (_STATUS_ERROR, str(ended.data.get("error", "step_error")))
    else:
        status = (_STATUS_OK, "")
    return _span(
        _span_id(task_id, started.run_id, started.seq), run_span, f"step {idx} {tool}",
        started.ts, ended.ts if ended is not None else (end or started.ts), trace=trace,
        attributes=attributes, status=status,
    )  # fmt: skip


def _mark(event: Event) -> dict[str, Any]:
    """A journal event that is not a step boundary, as a span event of its run."""
    attributes = [_attr("ninelives.seq", event.seq)]
    if event.step_idx is not None:
        attributes.append(_attr("ninelives.step", event.step_idx))
    attributes.extend(_attr(f"ninelives.{k}", v) for k, v in sorted(event.data.items()))
    return {"timeUnixNano": _nanos(event.ts), "name": event.kind, "attributes": attributes}
