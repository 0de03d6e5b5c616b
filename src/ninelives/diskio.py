"""Durable file primitives: what survives a power cut, written once.

The artifacts of :mod:`ninelives.tools.effects` and the blob files of
:mod:`ninelives.blobs` are both written here: :func:`write_new` puts the whole
content in a temporary file created with ``O_EXCL | O_NOFOLLOW``, fsyncs it,
hard-links it to its final name (which fails if the name exists, so two
writers can never both publish) and fsyncs the folder. :func:`make_folder`
makes folders whose names survive, :func:`fsync_file` and :func:`fsync_dir`
are the fsyncs never retried, and :data:`STORAGE_ERRNOS` names the errors that
say the storage is failing or full.

A leaf below ``tools`` and ``blobs``: it imports only the standard library,
:mod:`ninelives.errors`, :mod:`ninelives.crashpoints` and :mod:`ninelives.files`.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from dataclasses import dataclass

from . import crashpoints, files
from .errors import EffectUnknown, ToolError

_OPEN_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
#: Errors that say the storage is failing or full: retrying the step in this
#: process would only use up its attempts.
STORAGE_ERRNOS = frozenset({errno.EIO, errno.ENOSPC, errno.EDQUOT, errno.EROFS})


@dataclass(frozen=True, kw_only=True)
class Published:
    """Where the content is, whether it was already there, and its SHA-256."""

    path: str
    deduplicated: bool
    sha256: str
    size: int
    #: The name already held other content, kept as it was (``keep_other``).
    differs: bool = False


def sha256_hex(data: bytes) -> str:
    """The SHA-256 of ``data`` as hex digits."""
    import hashlib  # ~10 ms to import (OpenSSL): keep it off the CLI start-up path

    return hashlib.sha256(data).hexdigest()


def fsync_file(fd: int, path: str) -> None:
    """fsync an open file; a failure is :class:`~ninelives.errors.EffectUnknown`."""
    # Never retried: after a failed fsync the kernel may have dropped the dirty
    # pages, and a second fsync can report success for data that is gone.
    try:
        os.fsync(fd)
    except OSError as exc:
        raise EffectUnknown(
            f"fsync of {path} failed ({exc.strerror}); whether it is durable is unknown, "
            "stopping without retrying: the next run recovers"
        ) from exc


def fsync_dir(folder: str) -> None:
    """fsync a folder, so names linked or unlinked in it survive power loss.

    Raises :class:`~ninelives.errors.EffectUnknown` if the fsync fails.
    """
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fsync_file(fd, folder)
    finally:
        os.close(fd)


def make_folder(folder: str, mode: int = 0o777) -> None:
    """Create ``folder`` and its missing parents so that they survive power loss.

    A folder's name lives in its parent, so it is durable only once the parent
    is fsynced. The parent of ``folder`` is fsynced even when ``folder`` already
    existed: an earlier attempt may have died between its mkdir and that fsync.
    ``mode`` is that of the folders created (before the umask).
    """
    folder = os.path.abspath(folder)
    created = []
    path = folder
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        created.append(path)
        path = os.path.dirname(path)
    os.makedirs(folder, mode=mode, exist_ok=True)
    for parent in sorted({os.path.dirname(p) for p in [*created, folder]}, key=len):
        fsync_dir(parent)


def unusable_folder(folder: str) -> str | None:
    """Why no file can be written in ``folder`` (which :func:`make_folder` makes
    when missing), or None: a symlink, not a folder, or not writable here (its
    mode, a read-only mount, an immutable folder). Checked before work whose
    result must then be written there, so that it fails before, not after."""
    if os.path.islink(folder):
        return "is a symlink"
    existing = target = os.path.abspath(folder)
    while not os.path.lexists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    made = "" if existing == target else f"cannot be made: {existing} "
    if not os.path.isdir(existing):
        return f"{made}is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{made}is not writable"
    return None


def _existing(path: str) -> tuple[str, int]:
    """SHA-256 and size of the regular file someone else put at ``path``."""
    # A FIFO must not block the run, a symlink must not be followed, a huge
    # file is hashed a chunk at a time, never held in memory.
    try:
        fd = files.open_regular(path)
    except files.NotRegularFile as exc:
        raise ToolError(f"{exc}; refusing to publish over it") from None
    except OSError as exc:
        raise ToolError(f"{path} exists but cannot be read: {exc.strerror}") from exc
    try:
        return files.sha256_of(fd)
    finally:
        os.close(fd)


def write_new(
    folder: str,
    temp: str,
    chunks: Iterable[bytes],
    *,
    name: str | None = None,
    step: int | None = None,
    artifact: bool = False,
    private: bool = False,
    keep_other: bool = False,
) -> Published:
    """Write ``chunks`` durably as a new file in ``folder``; the primitive of
    :func:`publish_once` and of the blob store (:mod:`ninelives.blobs`).

    The chunks go to the temporary file ``temp`` (created with ``O_EXCL |
    O_NOFOLLOW``), hashed on the way, so nothing larger than one chunk is held;
    the file is fsynced, hard-linked to its final name (``name``, else the
    SHA-256 hex digest: content-addressed), the temporary name removed and the
    folder fsynced. A final name that already exists is checked: the same
    content is ``deduplicated``; different content is a :class:`ToolError` for
    an artifact (or, with ``keep_other``, kept as it is and reported
    ``deduplicated`` with ``differs`` and its own SHA-256), and for a
    content-addressed file (whose name says what it must hold) a damaged copy
    that is replaced. ``artifact`` enables the artifact crash points;
    ``private`` makes the folder 0700 and the file 0600.
    A failed fsync raises :class:`EffectUnknown`; an error raised by ``chunks``
    propagates with the temporary file removed.
    """
    make_folder(folder, 0o700 if private else 0o777)
    tmp = os.path.join(folder, temp)
    fd = os.open(tmp, _OPEN_NEW, 0o600 if private else 0o644)
    try:
        hexdigest, size = _write_all(fd, tmp, chunks)
        final = os.path.join(folder, name if name is not None else hexdigest)
        if artifact:
            crashpoints.crash("artifact_before_link", step)
        differs = False
        try:
            os.link(tmp, final, follow_symlinks=False)
            deduplicated = False
        except FileExistsError:
            if name is None:
                deduplicated = _keep_or_replace(final, tmp, hexdigest, size)
            else:
                hexdigest, size, differs = _already_named(final, (hexdigest, size), keep_other)
                deduplicated = True
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    if artifact:
        crashpoints.crash("artifact_before_dirsync", step)
    # Also on the deduplicated path: the earlier attempt may have died before
    # its folder fsync, and its name must be durable before we report it.
    fsync_dir(folder)
    return Published(
        path=final, deduplicated=deduplicated, sha256=hexdigest, size=size, differs=differs
    )


def _already_named(final: str, wrote: tuple[str, int], keep_other: bool) -> tuple[str, int, bool]:
    """The SHA-256 and size of what the name ``final`` already holds, and whether
    it differs from ``wrote``: a :class:`ToolError` then, unless ``keep_other``."""
    there = _existing(final)
    differs = there != wrote
    if differs and not keep_other:
        raise ToolError(f"{final} exists with different content; refusing to overwrite it")
    return there[0], there[1], differs


def _write_all(fd: int, path: str, chunks: Iterable[bytes]) -> tuple[str, int]:
    """Write ``chunks`` to ``fd`` (the new file ``path``), fsync and close it;
    its SHA-256 hex digest and size, hashed on the way."""
    import hashlib  # ~10 ms to import (OpenSSL): keep it off the CLI start-up path

    digest = hashlib.sha256()
    size = 0
    try:
        for chunk in chunks:
            digest.update(chunk)
            size += len(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
        fsync_file(fd, path)
    finally:
        os.close(fd)
    return digest.hexdigest(), size


def _keep_or_replace(final: str, tmp: str, expected: str, size: int) -> bool:
    """A content-addressed name exists: True if it holds ``expected`` (its
    modification time is refreshed, so a sweep of old unreferenced files spares
    it until the reference is committed); else the damaged copy is replaced."""
    try:
        fd = files.open_regular(final)
    except files.NotRegularFile as exc:
        raise ToolError(f"{exc}; refusing to store over it") from None
    try:
        same = os.fstat(fd).st_size == size and files.sha256_of(fd) == (expected, size)
    finally:
        os.close(fd)
    if same:
        os.utime(final)
        return True
    # Not atomic, but never wrong: between the two a reader finds the name
    # missing, which is as much an error as the damaged copy was.
    os.unlink(final)
    os.link(tmp, final, follow_symlinks=False)
    return False
