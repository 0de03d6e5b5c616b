"""Journal helpers: canonical JSON and the invariant checks (pure, no I/O)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

from .models import Event, EventKind

#: Kinds that close a ``step_started``.
CLOSING_KINDS = frozenset(
    {EventKind.STEP_FINISHED.value, EventKind.STEP_RECOVERED.value, EventKind.STEP_ERROR.value}
)


def dumps(value: Any) -> str:
    """Canonical JSON for stored columns: sorted keys, compact, UTF-8 kept."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def invariant_violations(events: Iterable[Event]) -> list[str]:
    """Return the journal invariant violations of one task's events (empty when clean).

    Checks the contract's invariant (``step_started`` equals the sum of its
    closing kinds), that every run id has exactly one ``run_started``, and that
    per step each start is closed before the next one begins.
    """
    problems: list[str] = []
    kinds: Counter[str] = Counter()
    run_starts: Counter[str] = Counter()
    open_steps: dict[int, int] = {}
    for event in events:
        kinds[event.kind] += 1
        if event.kind == EventKind.RUN_STARTED.value:
            run_starts[event.run_id] += 1
        elif event.kind == EventKind.STEP_STARTED.value and event.step_idx is not None:
            if event.step_idx in open_steps:
                problems.append(
                    f"step {event.step_idx}: started at seq {event.seq} while still "
                    f"open since seq {open_steps[event.step_idx]}"
                )
            open_steps[event.step_idx] = event.seq
        elif event.kind in CLOSING_KINDS and event.step_idx is not None:
            if open_steps.pop(event.step_idx, None) is None:
                problems.append(
                    f"step {event.step_idx}: {event.kind} at seq {event.seq} closes no start"
                )
    started = kinds[EventKind.STEP_STARTED.value]
    closed = sum(kinds[k] for k in CLOSING_KINDS)
    finished = kinds[EventKind.TASK_DONE.value] + kinds[EventKind.TASK_FAILED.value]
    if finished and started != closed:
        problems.append(f"{started} step_started but {closed} finished/recovered/error")
    for run_id, count in sorted(run_starts.items()):
        if count != 1:
            problems.append(f"run {run_id}: {count} run_started events")
    return problems
