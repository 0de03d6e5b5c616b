"""The published files a task's outputs record, checked against the artifacts folder."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ..models import Event, EventKind, StepStatus, Task, is_workflow
from .violation import Findings, Violation


def artifact_outputs(task: Task) -> dict[int, dict[str, Any]]:
    """Done steps whose output records a published file: ``path`` and ``sha256`` texts
    (a workflow step's record is the value it returned, inside ``{"value": ...}``)."""
    found = {}
    for s in task.steps:
        output: Any = s.output
        if s.status is StepStatus.DONE and is_workflow(task.goal):
            from ..replay import value_of

            output = value_of(output)
        if (
            s.status is StepStatus.DONE
            and isinstance(output, dict)
            and isinstance(output.get("path"), str)
            and isinstance(output.get("sha256"), str)
        ):
            found[s.idx] = output
    return found


def check_artifacts(task: Task, events: Sequence[Event], folder: str) -> list[Violation]:
    """Each published artifact exists in ``folder`` and matches its recorded
    ``sha256`` (and ``bytes``); no temporary file of this task is left behind."""
    from .. import files
    from ..tools.effects import is_temp_of

    found = Findings(task.id)
    finished = {e.step_idx: e.seq for e in events if e.kind == EventKind.STEP_FINISHED.value}
    for idx, output in sorted(artifact_outputs(task).items()):
        seqs = (finished[idx],) if idx in finished else ()
        name = os.path.basename(output["path"])
        path = os.path.join(folder, name)
        # Never blocks on a FIFO, never follows a symlink, hashes in chunks.
        try:
            fd = files.open_regular(path, shown=name)
        except FileNotFoundError:
            found.add("artifact_missing", f"step {idx}: {name} is not in {folder}", seqs)
            continue
        except files.NotRegularFile as exc:
            found.add("artifact_type", f"step {idx}: {exc}", seqs)
            continue
        except OSError as exc:
            found.add("artifact_missing", f"step {idx}: cannot read {path}: {exc.strerror}", seqs)
            continue
        try:
            digest, length = files.sha256_of(fd)
        except OSError as exc:
            found.add("artifact_missing", f"step {idx}: cannot read {path}: {exc.strerror}", seqs)
            continue
        finally:
            os.close(fd)
        size = output.get("bytes")
        if digest != output["sha256"] or (isinstance(size, int) and size != length):
            found.add(
                "artifact_content",
                f"step {idx}: {name} holds {length} bytes that do not match the "
                "sha256 its committed output records",
                seqs,
            )
    try:
        names = sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        names = []
    except OSError as exc:
        found.add("artifacts_unreadable", f"cannot list {folder}: {exc.strerror}")
        names = []
    for name in names:
        if is_temp_of(task.id, name):
            found.add("stray_temp", f"temporary file {name} left in {folder}")
    return found
