"""What a torture session counts: lost commits, re-executed effects, duplicate publications.

Pure reads of the tasks as stored and of the files in the artifacts folder;
:func:`ninelives.torture.torture` adds them up in its report.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import NineLivesError
from ..models import EventKind, StepStatus, Task
from ..verify import artifact_outputs

#: Entry separator of the built-in unsafe append log (``AGENT_UNSAFE_EFFECTS=1``).
UNSAFE_SEPARATOR = "\n---\n"


def lost_commits(observed: Mapping[int, Any], final: Task) -> list[str]:
    """Steps seen done (with these outputs) that ``final`` no longer holds done, unchanged."""
    by_idx = {s.idx: s for s in final.steps}
    lost = []
    for idx, output in sorted(observed.items()):
        step = by_idx.get(idx)
        if step is None or step.status is not StepStatus.DONE:
            lost.append(f"{final.id}: step {idx} was acknowledged done, now it is not")
        elif step.output != output:
            lost.append(f"{final.id}: step {idx} output changed after it was acknowledged")
    return lost


def reexecuted_effects(events: Sequence[Any]) -> int:
    """Step attempts beyond the first, summed over steps (``step_started`` - 1 each)."""
    starts: dict[int, int] = {}
    for event in events:
        if event.kind == EventKind.STEP_STARTED.value and event.step_idx is not None:
            starts[event.step_idx] = starts.get(event.step_idx, 0) + 1
    return sum(n - 1 for n in starts.values() if n > 1)


def _read_published(path: str) -> bytes | None:
    """The bytes of a regular file at ``path``, or None (missing, a FIFO, unreadable)."""
    from .. import files

    try:
        fd = files.open_regular(path)
    except (OSError, NineLivesError):
        return None  # a missing or odd file is a verify finding, not a duplicate
    try:
        return files.read_limited(fd, 1 << 30, path)
    except (OSError, NineLivesError):
        return None
    finally:
        os.close(fd)


def published_duplicates(tasks: Sequence[Task], folder: str) -> list[tuple[str, int]]:
    """Files whose content is not the one publication their output records, with
    the number of extra publications each holds: ``k - 1`` for the recorded
    content k times over, 1 for any other difference."""
    from ..diskio import sha256_hex

    found = []
    for task in tasks:
        for output in artifact_outputs(task).values():
            name = os.path.basename(output["path"])
            data = _read_published(os.path.join(folder, name))
            if data is None or sha256_hex(data) == output["sha256"]:
                continue
            size = output.get("bytes")
            extra = 1
            if isinstance(size, int) and 0 < size < len(data) and len(data) % size == 0:
                copies = len(data) // size
                if data == data[:size] * copies and sha256_hex(data[:size]) == output["sha256"]:
                    extra = copies - 1
            found.append((f"{name}: {extra} extra publication(s)", extra))
    return found


def append_log_duplicates(tasks: Sequence[Task], folder: str) -> list[tuple[str, int]]:
    """Extra entries in append logs: done outputs that name a ``path`` without a
    ``sha256`` (the built-in unsafe effect) against the entries each file holds;
    each finding comes with its number of extra entries."""
    cited: dict[str, int] = {}
    for task in tasks:
        recorded = artifact_outputs(task)
        for step in task.steps:
            out = step.output
            if (
                step.status is StepStatus.DONE
                and step.idx not in recorded
                and isinstance(out, dict)
                and isinstance(out.get("path"), str)
                and step.tool == "write_artifact"
            ):
                name = os.path.basename(out["path"])
                cited[name] = cited.get(name, 0) + 1
    found = []
    for name, count in sorted(cited.items()):
        data = _read_published(os.path.join(folder, name))
        if data is None:
            continue
        entries = data.decode("utf-8", "replace").count(UNSAFE_SEPARATOR)
        if entries > count:
            found.append((f"{name}: {entries} entries for {count} done step(s)", entries - count))
    return found


def count_duplicates(tasks: Sequence[Task], folder: str) -> tuple[int, list[str]]:
    """Extra publications in ``folder`` (each one counted once), and one line per file."""
    found = [*published_duplicates(tasks, folder), *append_log_duplicates(tasks, folder)]
    return sum(count for _, count in found), [line for line, _ in found]
