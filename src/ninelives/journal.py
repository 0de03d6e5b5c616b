"""Journal helpers: canonical JSON and the invariant checks (pure, no I/O)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, cast

from .blobs import Blobs, escape, needs_escape
from .errors import OutputRefused
from .models import MAX_DEPTH, Event, EventKind, StepStatus, Task, nested_deeper

#: Kinds that close a ``step_started``.
CLOSING_KINDS = frozenset(
    {EventKind.STEP_FINISHED.value, EventKind.STEP_RECOVERED.value, EventKind.STEP_ERROR.value}
)


#: Largest output a step may commit, in bytes of its JSON text (``NINELIVES_MAX_OUTPUT``).
MAX_OUTPUT_BYTES = 64 * 1024 * 1024
#: Longest error text a ``step_error`` keeps, in characters.
MAX_ERROR_CHARS = 2000


def dumps(value: Any) -> str:
    """Canonical JSON for stored columns: sorted keys, compact, UTF-8 kept.

    Standard JSON only: NaN and infinities raise ``ValueError`` instead of
    becoming ``NaN``/``Infinity``, which SQLite's ``json_extract``, PostgreSQL's
    ``jsonb`` and most JSON readers refuse.
    """
    if _encode is not None:
        try:
            return "".join(_encode(value, 0))
        except RecursionError:
            pass  # a value that holds itself, or nests past the stack: the encoder below says which
    return _CANONICAL.encode(value)


# One encoder for every call: json.dumps with options builds a new one each time.
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def _fast_encoder() -> Callable[[Any, int], Sequence[str]] | None:
    """``_CANONICAL``'s own C encoder, made once rather than at each call (every
    journal row, digest link and output is encoded: most are a few bytes, and
    making the encoder cost more than using it). Without the table of objects
    being encoded that finds a value holding itself: such a value ends in a
    RecursionError, and :func:`dumps` asks ``_CANONICAL`` then. None where the
    interpreter has no C encoder, or one that encodes otherwise."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    try:
        encode = make(None, _CANONICAL.default, json.encoder.encode_basestring, None,
                      ":", ",", True, False, False)  # fmt: skip
        probe = {"b": [1.5, None, True, "é\n"], "a": {}}
        fits = "".join(encode(probe, 0)) == _CANONICAL.encode(probe)
    except (TypeError, ValueError):
        return None
    return cast(Callable[[Any, int], Sequence[str]], encode) if fits else None


_encode = _fast_encoder()


def storable(value: Any, what: str) -> str:
    """``value`` as canonical JSON text that every store accepts, else ``ValueError``
    saying why: a type JSON lacks, NaN or an infinity, or text that is not valid
    Unicode (a lone surrogate cannot be encoded as UTF-8). ``what`` names it."""
    try:
        text = dumps(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"{what} is not standard JSON: {_why(value, exc)}") from None
    if "{" in text and (key := _non_string_key(value)):
        raise ValueError(f"{what} is not standard JSON: {key[0]}")
    _check_unicode(text, what)
    if nested_deeper(text, MAX_DEPTH):
        raise ValueError(f"{what} nests more than {MAX_DEPTH} levels deep")
    return text


def _why(value: Any, exc: BaseException) -> str:
    """What the encoder's error ``exc`` means: sorting a dict whose keys mix text and
    numbers fails with "'<' not supported", which names no key."""
    if isinstance(exc, TypeError) and (key := _non_string_key(value)):
        return key[0]
    return str(exc)


def _non_string_key(value: Any) -> tuple[str] | tuple[()]:
    """Why ``value`` would not read back as it was: a dict key that is not a string
    (JSON makes ``{1: "a"}`` ``{"1": "a"}``, and a resumed task would find another
    value than the first run had); ``()`` when every key is a string. Each
    container is walked once (a value that holds itself ends)."""
    stack, seen = [value], set()
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            for key, inner in item.items():
                if not isinstance(key, str):
                    return (f"key {key!r} is not a string (JSON keeps keys as text: "
                            "it would read back as another key)",)  # fmt: skip
                if isinstance(inner, (dict, list, tuple)):
                    stack.append(inner)
        elif isinstance(item, (list, tuple)):
            stack.extend(inner for inner in item if isinstance(inner, (dict, list, tuple)))
    return ()


def _check_unicode(text: str, what: str) -> int:
    """The UTF-8 size of ``text``, else ``ValueError`` naming the first bad character."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        bad = text[exc.start : exc.end]
        raise ValueError(
            f"{what} is not valid Unicode text: {bad!r} at character {exc.start} ({exc.reason})"
        ) from None


def encode_output(output: Any, max_bytes: int = MAX_OUTPUT_BYTES) -> str:
    """An output as the JSON text a ``done`` step stores: the one encoder of every
    path that stores one (a tool's return, ``resolve --done``, a probe's answer,
    an approval).

    An output that a reader would take for a blob reference or an escape (its
    only key ``"$blob"`` or ``"$raw"``) is wrapped as ``{"$raw": <output>}``
    (:func:`ninelives.blobs.escape`), so it reads back as it was given.
    Raises :class:`~ninelives.errors.OutputRefused` (recorded as a ``step_error``,
    before any commit) unless ``output`` is a mapping that :func:`storable`
    accepts and whose stored text is at most ``max_bytes`` bytes of UTF-8.
    """

    if not isinstance(output, Mapping):
        raise OutputRefused(f"output refused: the tool returned {type(output).__name__}, "
                            "not a JSON object (a dict)")  # fmt: skip
    try:
        text = dumps(output if isinstance(output, dict) else dict(output))
    except (TypeError, ValueError, RecursionError) as exc:
        raise OutputRefused(f"output refused: not standard JSON: {_why(output, exc)}") from None
    if key := _non_string_key(output):
        raise OutputRefused(f"output refused: not standard JSON: {key[0]}")
    if needs_escape(output):
        text = escape(text)
    try:
        size = _check_unicode(text, "the output")
    except ValueError as exc:
        raise OutputRefused(f"output refused: {exc}") from None
    if nested_deeper(text, MAX_DEPTH):
        # Readers recurse once per level: refused here, not found unreadable later.
        raise OutputRefused(f"output refused: it nests more than {MAX_DEPTH} levels deep")
    if size > max_bytes:
        raise OutputRefused(
            f"output refused: {size} bytes of JSON exceed the maximum output size of "
            f"{max_bytes} bytes (NINELIVES_MAX_OUTPUT)"
        )
    return text


def out_of_row(blobs: Blobs, threshold: int, encoded: str, tag: str) -> str:
    """The text to commit as a step's output: ``encoded`` itself, or, when it is
    over the blob threshold, the reference to a blob stored durably now, before
    the commit that will refer to it. Every output takes this way: a tool's, a
    probe's answer, ``resolve --done``. ``tag`` names a blob's temporary file."""
    if len(encoded) <= threshold // 4:  # at most 4 bytes per character: surely small
        return encoded
    data = encoded.encode("utf-8")
    if len(data) <= threshold:
        return encoded
    return dumps(blobs.put([data], tag=tag).as_json())


def error_text(exc: BaseException) -> str:
    """``Type: message`` for an exception from user code; ``Type`` and a note when
    its ``__str__`` itself raises (the failure is journaled all the same)."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception as inner:
        return f"{type(exc).__name__} (its message raised {type(inner).__name__})"


def clean_error(text: str) -> str:
    """Error text safe to journal: lone surrogates escaped, at most
    :data:`MAX_ERROR_CHARS` characters (the tail elided)."""
    if len(text) > MAX_ERROR_CHARS:
        text = text[:MAX_ERROR_CHARS] + f"… ({len(text) - MAX_ERROR_CHARS} more characters)"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def printable_json(value: Any, *, sort_keys: bool = False) -> str:
    """JSON for people and pipes (``status --outputs``, ``export``, the web
    view's API): UTF-8 kept, and valid even for rows written before NaN was
    refused (those numbers are printed as ``null``)."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, sort_keys=sort_keys)
    except ValueError:
        return json.dumps(_finite(value), ensure_ascii=False, allow_nan=False, sort_keys=sort_keys)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if value - value == 0 else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


class JournalProblem(NamedTuple):
    """One broken journal invariant, with the ``seq`` of every event involved."""

    message: str
    seqs: tuple[int, ...] = ()
    step: int | None = None


def journal_problems(events: Iterable[Event]) -> list[JournalProblem]:
    """The journal invariant violations of one task's events, with their sequence numbers.

    Checks the contract's invariant (``step_started`` equals the sum of its
    closing kinds once the task has ended), that every run id has exactly one
    ``run_started``, and that per step each start is closed before the next
    one begins and every closing event closes a start.
    """
    problems: list[JournalProblem] = []
    kinds: Counter[str] = Counter()
    run_starts: dict[str, list[int]] = {}
    open_steps: dict[int, int] = {}
    for event in events:
        kinds[event.kind] += 1
        if event.kind == EventKind.RUN_STARTED.value:
            run_starts.setdefault(event.run_id, []).append(event.seq)
        elif event.kind == EventKind.STEP_STARTED.value and event.step_idx is not None:
            if event.step_idx in open_steps:
                problems.append(
                    JournalProblem(
                        message=f"step {event.step_idx}: started at seq {event.seq} while "
                        f"still open since seq {open_steps[event.step_idx]}",
                        seqs=(open_steps[event.step_idx], event.seq),
                        step=event.step_idx,
                    )
                )
            open_steps[event.step_idx] = event.seq
        elif event.kind in CLOSING_KINDS and event.step_idx is not None:
            if open_steps.pop(event.step_idx, None) is None:
                problems.append(
                    JournalProblem(
                        message=f"step {event.step_idx}: {event.kind} at seq {event.seq} "
                        "closes no start",
                        seqs=(event.seq,),
                        step=event.step_idx,
                    )
                )
    started = kinds[EventKind.STEP_STARTED.value]
    closed = sum(kinds[k] for k in CLOSING_KINDS)
    finished = kinds[EventKind.TASK_DONE.value] + kinds[EventKind.TASK_FAILED.value]
    if finished and started != closed:
        problems.append(
            JournalProblem(
                message=f"{started} step_started but {closed} finished/recovered/error",
                seqs=tuple(sorted(open_steps.values())),
            )
        )
    for run_id, seqs in sorted(run_starts.items()):
        if len(seqs) != 1:
            problems.append(
                JournalProblem(
                    message=f"run {run_id}: {len(seqs)} run_started events", seqs=tuple(seqs)
                )
            )
    return problems


def invariant_violations(events: Iterable[Event]) -> list[str]:
    """Return the journal invariant violations of one task's events (empty when clean).

    The messages of :func:`journal_problems`.
    """
    return [problem.message for problem in journal_problems(events)]


#: Tools whose every step is a model call.
MODEL_TOOLS = frozenset({"llm", "agent"})


def step_usage(output: Any) -> Any:
    """The ``usage`` a step's output reports: its own, or, for a workflow step
    (stored as ``{"value": ...}``), its value's; None when it reports none."""
    if not isinstance(output, dict):
        return None
    if "usage" in output:
        return output["usage"]
    value = output.get("value") if len(output) == 1 else None
    return value.get("usage") if isinstance(value, dict) else None


def calls_models(task: Task) -> bool:
    """True when the task has a model step (``llm``, ``agent``, or an output with
    ``usage``: a workflow's ``ctx.chat`` and framework model steps report it too)."""
    return any(
        step.tool in MODEL_TOOLS or step_usage(step.output) is not None for step in task.steps
    )


def model_usage(task: Task, events: Iterable[Event]) -> dict[str, Any]:
    """What the task's model calls cost, and what resuming saved.

    ``model_calls``: done steps whose output reports ``usage`` (``llm``,
    ``agent`` turns); ``tokens``: their summed ``input_tokens`` and
    ``output_tokens``; ``model_calls_saved``: for each run that resumed the
    task (it went on to journal something of its own: a recovery, a step), the
    model calls already committed when it started, which it did not repeat. A
    run that found nothing to do (the task done, or waiting) saved nothing.
    """
    tokens = {"input_tokens": 0, "output_tokens": 0}
    model_steps = set()
    for step in task.steps:
        usage = step_usage(step.output)
        if step.status is StepStatus.DONE and isinstance(usage, dict):
            model_steps.add(step.idx)
            for key in tokens:
                value = usage.get(key)
                if isinstance(value, int) and not isinstance(value, bool):
                    tokens[key] += value
    events = list(events)
    acted = {e.run_id for e in events if e.kind != EventKind.RUN_STARTED.value}
    saved = 0
    committed: set[int] = set()
    for event in events:
        if event.kind == EventKind.RUN_STARTED.value:
            if event.run_id in acted:
                saved += len(committed)
        elif event.kind == EventKind.STEP_FINISHED.value and event.step_idx in model_steps:
            committed.add(event.step_idx)
    return {"model_calls": len(model_steps), "tokens": tokens, "model_calls_saved": saved}
