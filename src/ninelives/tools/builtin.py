"""The contract's built-in tools: ``fetch``, ``summarize`` and ``write_artifact``."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from .. import files
from ..blobs import CHUNK, Blobs
from ..blobs import current as current_blobs
from ..diskio import sha256_hex
from ..errors import PlanError, ToolError
from ..settings import Settings
from . import Registry, Tool, ToolContext, effects, load_tool_modules

if TYPE_CHECKING:
    from ..plan import Plan


def _need_from(step_input: Mapping[str, Any]) -> None:
    ref = step_input.get("from")
    if not isinstance(ref, int) or isinstance(ref, bool):
        raise PlanError("input needs 'from' (the index of an earlier step)")


def _source(ctx: Mapping[int, Any], step_input: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = step_input["from"]
    if ref not in ctx:
        raise ToolError(f"step {ref} has no committed output")
    output = ctx[ref]
    if not isinstance(output, Mapping):
        raise ToolError(f"step {ref} output is not an object")
    return output


def _step_of(idem_key: str) -> int | None:
    tail = idem_key.rpartition("-")[2]
    return int(tail) if tail.isdigit() else None


def _check_relative(path: Any) -> None:
    if not isinstance(path, str) or not path or "\0" in path:
        raise PlanError("input needs 'path', a non-empty string")
    if os.path.isabs(path) or ".." in path.replace("\\", "/").split("/"):
        raise PlanError(f"path {path!r} must stay inside the workspace (relative, no '..')")


def missing_fetch_paths(plan: Plan, workspace: str) -> list[tuple[int, str]]:
    """``(step, path)`` of each ``fetch`` step of ``plan`` whose file does not exist
    beneath ``workspace`` now (``fetch`` reads it there at run time)."""
    missing = []
    for idx, step in enumerate(plan.steps):
        path = step.input.get("path") if step.tool == "fetch" else None
        if isinstance(path, str) and not os.path.exists(os.path.join(workspace, path)):
            missing.append((idx, path))
    return missing


#: The largest file ``fetch`` reads into memory, its text in the output; a larger
#: one is streamed into the blob store (up to ``NINELIVES_MAX_FETCH``).
MAX_FETCH_BYTES = 32 << 20
FETCH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "a file path relative to the workspace"}
    },
    "required": ["path"],
    "additionalProperties": False,
}
#: An artifact's name when a model publishes it: plain data, never a path.
ARTIFACT_NAME = "[A-Za-z0-9][A-Za-z0-9._-]{0,99}"
WRITE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {
            "type": "string",
            "pattern": f"^{ARTIFACT_NAME}$",
            "description": "the file name, e.g. report.md",
        },
        "text": {"type": "string", "description": "the whole content of the file"},
    },
    "required": ["name", "text"],
    "additionalProperties": False,
}


def make_fetch(settings: Settings) -> Tool:
    """``fetch {"path"}`` -> ``{"chars", "sha256", "text"}`` of a UTF-8 file.

    The path is data relative to the workspace (the working directory, or
    ``NINELIVES_WORKSPACE``): absolute paths and ``..`` are refused at
    ``create``; at run time it is opened one component at a time beneath the
    workspace (:func:`ninelives.files.open_beneath`), so a symlink that
    leads out, or one swapped in while the path is resolved, is refused. Only
    a regular file is read (never a FIFO or a device), and only with a single
    name: a file with other hard links may have a name outside the workspace,
    so it is refused too. A file over :data:`MAX_FETCH_BYTES` (or the maximum
    output) is streamed into the task's blob store instead of read into memory,
    up to ``NINELIVES_MAX_FETCH``: ``{"chars", "sha256", "bytes", "text": ref}``
    where ``ref`` is ``{"$blob": {"sha256", "size"}}`` (:mod:`ninelives.blobs`).
    """

    def validate(step_input: Mapping[str, Any]) -> None:
        _check_relative(step_input.get("path"))

    def fetch(step_input: Mapping[str, Any], ctx: Mapping[int, Any], idem_key: str) -> Any:
        validate(step_input)
        return _fetch_file(settings, step_input["path"], idem_key)

    return Tool(
        name="fetch",
        fn=fetch,
        validate=validate,
        schema=FETCH_SCHEMA,
        description="Read a UTF-8 text file of the workspace; returns its text and sha256.",
    )


def _fetch_file(settings: Settings, path: str, idem_key: str) -> dict[str, Any]:
    """``fetch``'s output for ``path`` beneath the workspace: its text read into
    memory, or the file streamed into the blob store when it is too large."""
    limit = min(MAX_FETCH_BYTES, settings.max_output)
    try:
        fd = files.open_beneath(settings.workspace, path)
    except OSError as exc:
        raise ToolError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = _read_bounded(fd, path, settings, limit, idem_key)
    except OSError as exc:
        raise ToolError(f"cannot read {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if isinstance(data, dict):
        return data  # streamed into the blob store
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"{path} is not UTF-8 text") from None
    return {"chars": len(text), "sha256": sha256_hex(data), "text": text}


def _read_bounded(
    fd: int, path: str, settings: Settings, limit: int, idem_key: str
) -> bytes | dict[str, Any]:
    """The bytes of the open file, at most ``limit``; or, when it is larger and a
    blob store is open, the output of streaming it there. Refuses a file with
    more than one name."""
    what = (
        f"fetch's limit of {limit} bytes"
        if limit == MAX_FETCH_BYTES
        else f"the maximum output size of {limit} bytes (NINELIVES_MAX_OUTPUT)"
    )
    st = os.fstat(fd)
    if st.st_nlink > 1:
        raise ToolError(
            f"{path} has {st.st_nlink} hard links, so it may be a file from outside "
            "the workspace; fetch reads only files with one name (copy it instead)"
        )
    # Bounded: a huge file must be a clear step_error, not a process
    # that runs out of memory on every attempt. One larger than what an
    # output holds is streamed to the blob store instead, when there is one.
    blobs = current_blobs()
    if st.st_size > limit and blobs is not None:
        if st.st_size > settings.max_fetch:
            raise ToolError(
                f"{path} is larger than fetch's limit of {settings.max_fetch} bytes "
                "(NINELIVES_MAX_FETCH)"
            )
        return _fetch_to_blob(fd, path, settings.max_fetch, blobs, idem_key)
    if st.st_size > limit:
        raise ToolError(f"{path} is larger than {what}")
    return files.read_limited(fd, limit, path)


def _fetch_to_blob(fd: int, path: str, limit: int, blobs: Blobs, idem_key: str) -> dict[str, Any]:
    """Stream a large file into the blob store, a chunk at a time, checking that
    it is UTF-8 and counting its characters on the way: ``{"chars", "sha256",
    "bytes", "text": {"$blob": {"sha256", "size"}}}``."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")()
    chars = 0
    total = 0

    def chunks() -> Iterator[bytes]:
        nonlocal chars, total
        while chunk := os.read(fd, CHUNK):
            total += len(chunk)
            if total > limit:  # grown since it was measured
                raise ToolError(f"{path} is larger than fetch's limit of {limit} bytes")
            try:
                chars += len(decoder.decode(chunk))
            except UnicodeDecodeError:
                raise ToolError(f"{path} is not UTF-8 text") from None
            yield chunk
        try:
            chars += len(decoder.decode(b"", final=True))
        except UnicodeDecodeError:
            raise ToolError(f"{path} is not UTF-8 text") from None

    ref = blobs.put(chunks(), tag=idem_key)
    return {"chars": chars, "sha256": ref.sha256, "bytes": ref.size, "text": ref.as_json()}


def _leading_text(ref: Mapping[str, Any], lines: int = 3) -> str:
    """The start of a blob's UTF-8 text, up to its ``lines``-th non-empty line."""
    import codecs

    from ..blobs import open_ref

    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = ""
    for chunk in open_ref(ref):
        text += decoder.decode(chunk)
        if sum(1 for line in text.splitlines() if line.strip()) > lines:
            break
    return text


def stub_summary(text: str) -> str:
    """The stub engine: the first three non-empty lines, stripped, joined by newlines."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return "\n".join(lines[:3])


def _ollama_summary(settings: Settings, text: str) -> str:
    """Ollama's ``/api/generate``, bounded like the model engines: the whole
    exchange within ``NINELIVES_LLM_TIMEOUT``, a reply of at most
    :data:`ninelives.llm.MAX_REPLY_BYTES`, no proxy, no redirect."""
    from ..llm import post_json, whole

    body = {
        "model": settings.ollama_model,
        "prompt": "Summarize the following notes in exactly three short lines.\n\n" + text,
        "stream": False,
    }
    url = settings.ollama_url.rstrip("/") + "/api/generate"
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    reply = post_json("ollama", url, body, headers, timeout=settings.llm_timeout)
    summary = reply.get("response") if isinstance(reply, dict) else None
    if not isinstance(summary, str):
        raise ToolError("ollama reply has no 'response' text")
    return whole(summary.strip())


def make_summarize(settings: Settings) -> Tool:
    """``summarize {"from"}`` -> ``{"summary", "engine"}`` with the stub or Ollama engine."""

    def summarize(step_input: Mapping[str, Any], ctx: Mapping[int, Any], idem_key: str) -> Any:
        source = _source(ctx, step_input)
        text = source.get("text", source.get("summary"))
        if isinstance(text, dict) and settings.llm != "ollama":
            # A large fetch: its text is a blob, read only as far as needed.
            return {"summary": stub_summary(_leading_text(text)), "engine": "stub"}
        if not isinstance(text, str):
            raise ToolError(f"step {step_input['from']} output has no text to summarize")
        if settings.llm == "ollama":
            return {"summary": _ollama_summary(settings, text), "engine": "ollama"}
        return {"summary": stub_summary(text), "engine": "stub"}

    return Tool(name="summarize", fn=summarize, validate=_need_from)


def make_write_artifact(settings: Settings) -> Tool:
    """``write_artifact {"from"}`` -> ``{"path", "deduplicated", "sha256", "bytes"}``.

    Publishes the summary as ``<artifacts>/<idem_key>.md`` exactly once in
    outcome (the folder recorded with the task, else ``settings.artifacts``), or
    with ``AGENT_UNSAFE_EFFECTS=1`` appends it to ``report.log``. A regular
    file already at the final name is kept and reported ``"deduplicated": true``
    (with ``"differs": true``, and its own ``sha256`` and ``bytes``, when it holds
    other text).
    The form a model calls, ``{"name", "text"}``, publishes ``text`` as
    ``<artifacts>/<idem_key>+<name>`` (:func:`~ninelives.tools.effects.model_artifact`).
    """

    def write_artifact(step_input: Mapping[str, Any], ctx: ToolContext) -> Any:
        _check_write(step_input)
        idem_key = ctx.idem_key
        name = f"{idem_key}.md"
        if "from" in step_input:
            source = _source(ctx.outputs, step_input)
            summary = source.get("summary", source.get("text"))
            if not isinstance(summary, str):
                raise ToolError(f"step {step_input['from']} output has no summary to write")
        else:  # the form a model calls: the key in the name keeps it idempotent
            summary, name = step_input["text"], effects.model_artifact(idem_key, step_input["name"])
        folder = effects.artifacts_folder(settings.artifacts)
        if settings.unsafe_effects:
            path = os.path.join(folder, "report.log")
            effects.append_unsafe(path, (summary + "\n---\n").encode())
            return {"path": path, "deduplicated": False}
        data = summary.encode()
        earlier = None
        if "from" not in step_input and ctx.attempt > 1:
            # An attempt of an older version may have published it under the name
            # of before (``<idem_key>-<name>``): found there, it is not published twice.
            earlier = effects.holds(folder, f"{idem_key}-{step_input['name']}", data)
        # The contract form keeps whatever file is already at its final name and
        # reports it deduplicated, as the guide's agent does (a report kept from an
        # earlier database); a model's named artifact is refused instead.
        published = earlier or effects.publish_once(
            folder, name, data, step=_step_of(idem_key), keep_other="from" in step_input
        )
        output = {
            "path": published.path,
            "deduplicated": published.deduplicated,
            "sha256": published.sha256,
            "bytes": published.size,
        }
        if published.differs:
            output["differs"] = True  # the sha256 and bytes are those of the file there
        return output

    return Tool(
        name="write_artifact",
        fn=write_artifact,
        takes_context=True,
        validate=_check_write,
        schema=WRITE_SCHEMA,
        description="Publish a text file exactly once (a retry never writes a second copy).",
    )


def _check_write(step_input: Mapping[str, Any]) -> None:
    if "from" in step_input:
        _need_from(step_input)
        return
    import re

    name, text = step_input.get("name"), step_input.get("text")
    if not isinstance(text, str) or not isinstance(name, str):
        raise PlanError("input needs 'from' (an earlier step), or 'name' and 'text'")
    if not re.fullmatch(ARTIFACT_NAME, name):
        raise PlanError(
            f"artifact name {name!r}: use 1-100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )


def default_registry(settings: Settings) -> Registry:
    """The built-in tools configured by ``settings``, plus entry-point tools on demand,
    plus the tools of the modules in ``settings.tool_modules`` (``NINELIVES_TOOLS``)."""
    from .approval import make_approval
    from .model import make_agent, make_llm

    registry = Registry(
        [
            make_fetch(settings),
            make_summarize(settings),
            make_write_artifact(settings),
            make_llm(),
            make_approval(),
        ]
    )
    registry.add(make_agent(registry.lookup))
    if settings.tool_modules:
        load_tool_modules(registry, settings.tool_modules)
    return registry
