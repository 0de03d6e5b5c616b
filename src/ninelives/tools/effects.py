"""Effect helpers: publish a file exactly once in outcome, and clean up after crashes.

:func:`publish_once` writes the whole content to a temporary file created with
``O_EXCL | O_NOFOLLOW``, fsyncs it, hard-links it to its final name (which fails
if the name exists, so two attempts can never both publish) and fsyncs the
folder, so the final name either does not exist or holds the complete text,
even after a power cut.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

from .. import crashpoints
from ..errors import ToolError

_OPEN_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_OPEN_READ = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True, kw_only=True)
class Published:
    """Where the content is, whether it was already there, and its SHA-256."""

    path: str
    deduplicated: bool
    sha256: str
    size: int


def _sha256(data: bytes) -> str:
    import hashlib  # ~10 ms to import (OpenSSL): keep it off the CLI start-up path

    return hashlib.sha256(data).hexdigest()


def fsync_dir(folder: str) -> None:
    """fsync a folder, so names linked or unlinked in it survive power loss."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_existing(path: str, expected: str) -> None:
    try:
        fd = os.open(path, _OPEN_READ)
    except OSError as exc:  # ELOOP: a planted symlink is never followed
        raise ToolError(f"{path} exists and is not a regular file") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ToolError(f"{path} exists and is not a regular file")
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    if _sha256(b"".join(chunks)) != expected:
        raise ToolError(f"{path} exists with different content; refusing to overwrite it")


def publish_once(folder: str, name: str, data: bytes, *, step: int | None = None) -> Published:
    """Publish ``data`` as ``folder/name`` unless that name already holds it.

    Idempotent: a second call with the same content returns
    ``deduplicated=True`` and changes nothing. A different file already at the
    name (or a symlink) is a :class:`ToolError`, never overwritten or followed.
    """
    if not name or "/" in name or name.startswith(".") or "\0" in name:
        raise ToolError(f"unsafe artifact name {name!r}")
    os.makedirs(folder, exist_ok=True)
    final = os.path.join(folder, name)
    digest = _sha256(data)
    tmp = os.path.join(folder, f".{name}.{os.urandom(8).hex()}.tmp")
    fd = os.open(tmp, _OPEN_NEW, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        crashpoints.crash("artifact_before_link", step)
        try:
            os.link(tmp, final, follow_symlinks=False)
            deduplicated = False
        except FileExistsError:
            _check_existing(final, digest)
            deduplicated = True
    finally:
        os.unlink(tmp)
    crashpoints.crash("artifact_before_dirsync", step)
    # Also on the deduplicated path: the earlier attempt may have died before
    # its folder fsync, and its name must be durable before we report it.
    fsync_dir(folder)
    return Published(path=final, deduplicated=deduplicated, sha256=digest, size=len(data))


def append_unsafe(path: str, data: bytes) -> None:
    """Append ``data`` to ``path``: deliberately not idempotent (the negative control)."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_pattern(task_id: str) -> re.Pattern[str]:
    """Names of the temporary files that :func:`publish_once` makes for one task."""
    return re.compile(rf"\.{re.escape(task_id)}-\d+\.md\.[0-9a-f]{{16}}\.tmp")


def remove_orphans(folder: str, task_id: str) -> list[str]:
    """Delete temp files a killed run of ``task_id`` left in ``folder``; return their names.

    Only this task's own names are touched, so runs of other tasks in the same
    folder are never disturbed. Runs under the task's lock.
    """
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    pattern = temp_pattern(task_id)
    removed = [n for n in names if pattern.fullmatch(n)]
    for name in removed:
        try:
            os.unlink(os.path.join(folder, name))
        except FileNotFoundError:
            pass
    return removed
