"""A person's decisions: ``ninelives resolve`` and ``ninelives approve``.

Each is one fenced transaction (:meth:`~ninelives.store.Store.decide_step`) and
needs only the store: no tools, no settings, no runner.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ..errors import InputError, OutputRefused
from ..journal import encode_output, out_of_row
from ..lineage import check_reason
from ..models import APPROVAL_TOOL, EventKind, StepStatus, Task
from ..names import check_stored_id, new_run_id
from ..plan import unique_keys
from ..store import Decision, decision_target

if TYPE_CHECKING:
    from ..store import Store

#: A workflow approval's input key, and its value, for a rejection the code reads.
ON_REJECT = "on_reject"
ANSWER = "answer"

#: What ``--done`` holds when it is not an object, in JSON's own words.
_JSON_KIND = {list: "an array", str: "a string", int: "a number", float: "a number",
              bool: "a boolean", type(None): "null"}  # fmt: skip


def resolve(
    store: Store,
    task_id: str,
    idx: int,
    *,
    done: str | None = None,
    retry: bool = False,
    max_output: int | None = None,
    blob_threshold: int | None = None,
) -> Task:
    """``ninelives resolve``: a person states the outcome of blocked step ``idx``.

    ``done`` (JSON text of an object, checked like a tool's output) commits the
    step ``done`` with it; ``retry`` puts it back to ``pending`` to run again.
    Either way ``step_resolved`` is journaled and the task becomes ``pending``.
    :class:`InputError` (nothing changed) for bad JSON or a step not blocked.
    An output over ``blob_threshold`` bytes is stored as a blob, as a tool's is.
    """
    check_stored_id(task_id)
    decision = resolve_decision(done=done, retry=retry, max_output=max_output)
    if decision.output is not None and blob_threshold is not None:
        output = _out_of_row(store, task_id, idx, decision.output, blob_threshold)
        decision = decision._replace(output=output)
    return store.decide_step(task_id, new_run_id(), idx, decision)


def resolve_decision(
    *, done: str | None = None, retry: bool = False, max_output: int | None = None
) -> Decision:
    """What ``resolve`` commits: ``done`` (JSON text of an object, checked like a
    tool's output) or ``retry``; :class:`InputError` for anything else."""
    if (done is None) == (not retry):
        raise InputError("say either --done JSON (what the step output) or --retry")
    if done is None:
        return Decision(
            expect=StepStatus.BLOCKED, status=StepStatus.PENDING, kind=EventKind.STEP_RESOLVED,
            data={"outcome": "retry"},
        )  # fmt: skip
    try:
        value = json.loads(done, object_pairs_hook=unique_keys)  # a key twice: ambiguous
    except (ValueError, RecursionError) as exc:  # too deep for the decoder, too
        raise InputError(f"--done is not JSON: {exc}") from None
    if not isinstance(value, dict):
        # A person gave it: "the tool returned list" named no tool of theirs.
        kind = _JSON_KIND.get(type(value), type(value).__name__)
        raise InputError(f"--done must be a JSON object ({{...}}), the step's output; got {kind}")
    try:
        output = encode_output(value, *(() if max_output is None else (max_output,)))
    except OutputRefused as exc:
        raise InputError(f"--done {exc}") from None
    return Decision(
        expect=StepStatus.BLOCKED, status=StepStatus.DONE, kind=EventKind.STEP_RESOLVED,
        data={"outcome": "done"}, output=output,
    )  # fmt: skip


def check_note(note: str | None) -> None:
    """:class:`InputError` for an ``approve --note`` a journal cannot keep: bounded
    as a cancel's reason is, since a rejection's note becomes the task's reason."""
    check_reason(note, "--note")


def _out_of_row(store: Store, task_id: str, idx: int, output: str, threshold: int) -> str:
    """``output`` as its commit stores it; a blob is written only for a step the
    decision then finds blocked, so bad input leaves the blob folder as it was."""
    if len(output.encode("utf-8")) <= threshold:
        return output
    said = Decision(StepStatus.BLOCKED, StepStatus.DONE, EventKind.STEP_RESOLVED, data={})
    decision_target(store.get_task(task_id), idx, said)
    return out_of_row(store.blobs, threshold, output, f"{task_id}-{idx}")


def approve(
    store: Store, task_id: str, idx: int, *, reject: bool = False, note: str | None = None
) -> Task:
    """``ninelives approve``: a person decides waiting approval step ``idx``.

    Approved: the step is ``done`` with ``{"approved": true, "note": ...}``
    (``step_approved``) and the task ``pending``. Rejected: the step and the task
    fail (``step_rejected``, ``task_failed`` with the note as its reason), unless
    the step is a workflow's ``ctx.approval(..., on_reject="answer")``: then the
    step is ``done`` with ``{"approved": false, "note": ...}`` (``step_rejected``
    with ``outcome: answer``) and the task ``pending``, for the code to read.
    """
    check_stored_id(task_id)
    check_note(note)
    said: dict[str, Any] = {} if note is None else {"note": note}
    if reject and answers_rejection(store.get_task(task_id), idx):
        decision = Decision(
            expect=StepStatus.WAITING, status=StepStatus.DONE, kind=EventKind.STEP_REJECTED,
            data={**said, "outcome": ANSWER}, output=encode_output({"approved": False, **said}),
        )  # fmt: skip
    elif reject:
        decision = Decision(
            expect=StepStatus.WAITING, status=StepStatus.FAILED, kind=EventKind.STEP_REJECTED,
            data=said, reason=note or f"step {idx} was rejected (no note)",
        )  # fmt: skip
    else:
        decision = Decision(
            expect=StepStatus.WAITING, status=StepStatus.DONE, kind=EventKind.STEP_APPROVED,
            data=said, output=encode_output({"approved": True, **said}),
        )  # fmt: skip
    return store.decide_step(task_id, new_run_id(), idx, decision)


def answers_rejection(task: Task, idx: int) -> bool:
    """True when step ``idx`` is a workflow's approval whose rejection is an answer
    the code reads (``on_reject="answer"``), not the task's failure. A plan's
    ``approval`` step never is: no code after it reads a rejection."""
    step = next((s for s in task.steps if s.idx == idx), None)
    return step is not None and step.tool != APPROVAL_TOOL and step.input.get(ON_REJECT) == ANSWER
