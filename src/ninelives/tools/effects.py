"""Effect helpers: publish a file exactly once in outcome, and clean up after crashes.

:func:`publish_once` writes the whole content to a temporary file created with
``O_EXCL | O_NOFOLLOW``, fsyncs it, hard-links it to its final name (which fails
if the name exists, so two attempts can never both publish) and fsyncs the
folder, so the final name either does not exist or holds the complete text,
even after a power cut.

A failed fsync is never retried, and a write that fails because the storage
is failing or full (``EIO``, ``ENOSPC``, ...) does not count as a tool error
to retry: both raise :class:`~ninelives.errors.EffectUnknown`, which stops the
runner at once; the next run recovers the step.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable
from contextvars import ContextVar

from .. import files
from ..diskio import (
    STORAGE_ERRNOS,
    Published,
    fsync_dir,
    make_folder,
    sha256_hex,
    write_new,
)
from ..errors import EffectUnknown, ToolError

#: Kept for tools that imported the durable primitives from here.
__all__ = [
    "Published",
    "append_unsafe",
    "artifacts_folder",
    "fsync_dir",
    "holds",
    "is_temp_of",
    "make_folder",
    "model_artifact",
    "publish_once",
    "remove_orphans",
    "write_new",
]


#: The artifacts folder of the task being run, set by the runtime around its steps.
TASK_ARTIFACTS: ContextVar[str | None] = ContextVar("ninelives_task_artifacts", default=None)


def artifacts_folder(default: str | None = None) -> str:
    """The folder the current step's task publishes to.

    Inside a step this is the folder recorded with the task at ``create``
    (the same for every run of it, whatever the working directory or
    ``AGENT_ARTIFACTS`` of the process that resumes it); outside a step, or for
    a task that recorded none, ``default``, else ``AGENT_ARTIFACTS``, else
    ``artifacts``. Tools that publish files should put them here.
    """
    folder = TASK_ARTIFACTS.get()
    if folder is not None:
        return folder
    if default is not None:
        return default
    return os.environ.get("AGENT_ARTIFACTS") or "artifacts"


def publish_once(
    folder: str, name: str, data: bytes, *, step: int | None = None, keep_other: bool = False
) -> Published:
    """Publish ``data`` as ``folder/name`` unless that name already holds it.

    ``name`` is a plain file name (no ``/``, not hidden) of at most
    :data:`MAX_NAME_BYTES` bytes, else a :class:`ToolError` before any write.

    Idempotent: a second call with the same content returns
    ``deduplicated=True`` and changes nothing. A different regular file already
    at the name is a :class:`ToolError`; with ``keep_other`` it is kept as it is
    and reported ``deduplicated=True, differs=True`` (the contract's
    ``write_artifact``). Either way it is never overwritten, and a symlink, a
    folder or a device there is never followed (a :class:`ToolError`).
    A failed fsync, or storage that is failing or full, raises
    :class:`~ninelives.errors.EffectUnknown` (the temporary file is removed).
    """
    if not name or "/" in name or name.startswith(".") or "\0" in name:
        raise ToolError(f"unsafe artifact name {name!r}")
    if len(os.fsencode(name)) > MAX_NAME_BYTES:
        raise ToolError(
            f"artifact name {name[:40]!r}... is too long: at most {MAX_NAME_BYTES} bytes "
            "(its temporary file's name must fit too)"
        )
    if isinstance(data, str):
        raise TypeError(f"publish_once takes bytes, not {type(data).__name__}: encode text first")
    try:
        return _publish(folder, name, data, step, keep_other)
    except OSError as exc:
        if exc.errno in STORAGE_ERRNOS:
            raise EffectUnknown(
                f"publishing {name} in {folder} failed ({exc.strerror}), stopping: "
                "the next run recovers"
            ) from exc
        if exc.errno in (errno.EEXIST, errno.ENOTDIR) and not os.path.isdir(folder):
            # makedirs' own error names neither the folder's role nor the fix.
            raise ToolError(
                f"cannot publish {name}: {folder} is not a folder (a file, FIFO, device "
                "or dangling link is there or in its path): nothing was published; move it away"
            ) from None
        raise


#: The longest artifact name: a file name's 255 bytes less what its temporary
#: file adds (``.NAME.<16 hex digits>.tmp``, see :func:`_publish`).
MAX_NAME_BYTES = 255 - 22


def _publish(folder: str, name: str, data: bytes, step: int | None, keep_other: bool) -> Published:
    temp = f".{name}.{os.urandom(8).hex()}.tmp"
    return write_new(
        folder, temp, [data], name=name, step=step, artifact=True, keep_other=keep_other
    )


def append_unsafe(path: str, data: bytes) -> None:
    """Append ``data`` to ``path``: deliberately not idempotent (the negative control)."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    # O_NONBLOCK: a FIFO planted at the name fails (ENXIO) instead of waiting for a reader.
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK
    fd = os.open(path, flags, 0o644)
    try:
        files.check_regular(fd, path)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


#: Between a step's idempotency key and the name a model gave its artifact: a
#: character no task id can hold, so no two tasks' artifact names ever meet
#: (``demo`` step 2's ``2.md`` is ``demo-2+2.md``, never ``demo-2``'s ``demo-2-2.md``).
MODEL_SEPARATOR = "+"
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}"
#: What follows ``.TASK-`` in the name of a temporary file of :func:`publish_once`:
#: the contract's ``<idx>.md`` or a model's ``<idx>+<name>``, then the random tail.
_TEMP_TAIL = re.compile(rf"\d+(?:\.md|\{MODEL_SEPARATOR}{_NAME})\.[0-9a-f]{{16}}\.tmp")
#: The same tail in the model form of versions before :data:`MODEL_SEPARATOR`: ``<idx>-<name>``.
_OLD_TAIL = re.compile(rf"\d+-{_NAME}\.[0-9a-f]{{16}}\.tmp")
_TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def model_artifact(idem_key: str, name: str) -> str:
    """The file name of the artifact a model named ``name`` in the step of ``idem_key``."""
    return f"{idem_key}{MODEL_SEPARATOR}{name}"


def is_temp_of(task_id: str, name: str) -> bool:
    """Whether ``name`` is a temporary file that :func:`publish_once` made for ``task_id``.

    Either form of today, which no other task's name can match; or the model form
    of older versions (``.TASK-<idx>-<name>.<hex>.tmp``) when no other reading of
    the name fits (``.r-2-3.md...`` may be ``r-2``'s step 3 as well as ``r``'s
    ``3.md``: such a name is the contract form's, so ``r`` leaves it alone).
    """
    # A prefix test, not a pattern compiled per task: a run start checks every
    # name in the artifacts folder, which grows with every task published.
    prefix = f".{task_id}-"
    if not name.startswith(prefix):
        return False
    if _TEMP_TAIL.fullmatch(name, len(prefix)) is not None:
        return True
    return _OLD_TAIL.fullmatch(name, len(prefix)) is not None and _owners(name) == [task_id]


def _owners(name: str) -> list[str]:
    """Every task id that could own temporary file ``name``; [] when a form of
    today owns it (which no task of an older form may then claim)."""
    owners = []
    at = name.find("-", 1)
    while at > 0:
        task_id = name[1:at]
        if _TASK_ID.fullmatch(task_id):
            if _TEMP_TAIL.fullmatch(name, at + 1) is not None:
                return []
            if _OLD_TAIL.fullmatch(name, at + 1) is not None:
                owners.append(task_id)
        at = name.find("-", at + 1)
    return owners


def holds(folder: str, name: str, data: bytes) -> Published | None:
    """``folder/name`` as published, if it is a regular file holding exactly ``data``
    (its folder fsynced, as :func:`publish_once` leaves it); None otherwise."""
    path = os.path.join(folder, name)
    try:
        fd = files.open_regular(path)
    except (OSError, files.NotRegularFile):
        return None
    try:
        size = os.fstat(fd).st_size
        digest = files.sha256_of(fd) if size == len(data) else None
    finally:
        os.close(fd)
    if digest != (sha256_hex(data), len(data)):
        return None
    fsync_dir(folder)
    return Published(path=path, deduplicated=True, sha256=digest[0], size=digest[1])


def remove_orphans(
    folder: str, task_id: str, log: Callable[[str], None] | None = None
) -> list[str]:
    """Delete temp files a killed run of ``task_id`` left in ``folder``; return their names.

    Only this task's own names are touched, so runs of other tasks in the same
    folder are never disturbed. Runs under the task's lock. Cleanup never stops
    a run: a folder it cannot list, or an entry it cannot remove (a folder
    planted under a temp name, a file in a sticky folder owned by someone
    else), is left alone and reported once through ``log``.
    """
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:  # EACCES, ELOOP, EIO: nothing to clean that we can see
        _tell(log, f"{task_id}: cannot list {folder} to remove orphaned temporary files "
              f"({exc.strerror}); left as they are")  # fmt: skip
        return []
    removed = []
    skipped = []
    for name in names:
        if not is_temp_of(task_id, name):
            continue
        try:
            os.unlink(os.path.join(folder, name))
        except FileNotFoundError:
            continue
        except OSError as exc:  # EISDIR/EPERM (a folder), EPERM/EACCES (sticky folder)
            skipped.append(f"{name} ({exc.strerror})")
            continue
        removed.append(name)
    if skipped:
        _tell(log, f"{task_id}: left {len(skipped)} orphaned temporary name(s) in {folder} "
              f"that cannot be removed: {', '.join(sorted(skipped))}")  # fmt: skip
    return removed


def _tell(log: Callable[[str], None] | None, line: str) -> None:
    if log is not None:
        log(line)
