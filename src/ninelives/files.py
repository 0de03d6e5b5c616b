"""Reading files that someone else may have planted: never block, never follow out.

Every read of a file ninelives did not just create goes through here:

* :func:`open_regular` opens with ``O_NONBLOCK | O_NOFOLLOW`` and checks
  ``S_ISREG`` on the open descriptor, so a FIFO (which would block ``open`` or
  ``read`` forever), a device (``/dev/zero`` never ends) or a symlink is
  refused instead of read.
* :func:`open_beneath` resolves a relative path one component at a time from
  an open descriptor of the root (``openat`` with ``O_NOFOLLOW``), following
  symlinks itself and only while they stay inside the root. There is no gap
  between checking a path and opening it for a rename or a swapped symlink to
  slip through: what is checked is the descriptor that is read.
* :func:`read_limited` reads at most a given number of bytes.
"""

from __future__ import annotations

import errno
import os
import stat

from .errors import NotRegularFile as NotRegularFile  # its old home: kept importable
from .errors import ToolError

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
#: Reading a planted FIFO must fail at once, not wait for a writer.
OPEN_READ = os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
_OPEN_DIR = os.O_RDONLY | _NOFOLLOW | _DIRECTORY | _CLOEXEC
#: The most symlinks one path may go through (Linux's own limit).
MAX_SYMLINKS = 40


def kind_of(mode: int) -> str:
    """A short description of a file type, for messages."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symlink"
    return "not a regular file"


def check_regular(fd: int, shown: str) -> os.stat_result:
    """``fstat(fd)``; :class:`NotRegularFile` unless it is a regular file."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFile(f"{shown} is {kind_of(st.st_mode)}, not a regular file")
    return st


def open_regular(path: str, *, shown: str | None = None) -> int:
    """Open ``path`` for reading without blocking or following a final symlink.

    Returns the descriptor of a regular file; raises :class:`NotRegularFile`
    for anything else and lets ``OSError`` (``ENOENT``, ``EACCES``) through.
    """
    try:
        fd = os.open(path, OPEN_READ)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):  # O_NOFOLLOW met a symlink
            raise NotRegularFile(f"{shown or path} is a symlink, not a regular file") from None
        raise
    try:
        check_regular(fd, shown or path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_limited(fd: int, limit: int, shown: str) -> bytes:
    """Read all of ``fd``; :class:`ToolError` if it holds more than ``limit`` bytes."""
    chunks = []
    total = 0
    while chunk := os.read(fd, min(1 << 20, limit + 1 - total)):
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise ToolError(f"{shown} is larger than {limit} bytes")
    return b"".join(chunks)


def sha256_of(fd: int) -> tuple[str, int]:
    """SHA-256 and size of everything left in ``fd``, read in chunks."""
    import hashlib  # ~10 ms to import (OpenSSL): keep it off the CLI start-up path

    digest = hashlib.sha256()
    size = 0
    while chunk := os.read(fd, 1 << 20):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def open_beneath(root: str, relpath: str) -> int:
    """A read descriptor of the regular file ``relpath`` names inside ``root``.

    Each component is opened with ``O_NOFOLLOW`` relative to the descriptor of
    the folder before it. A symlink met on the way is read and resolved here:
    a relative target continues from its folder, an absolute one must lie
    under ``realpath(root)``, and ``..`` may never climb above ``root``.
    Raises :class:`ToolError` for a path that leads outside, and
    :class:`NotRegularFile` for a FIFO, device, socket or folder; other
    ``OSError`` (``ENOENT``, ``EACCES``) pass through.
    """
    real_root = os.path.realpath(root)
    outside = ToolError(f"{relpath} leads outside the workspace")
    folders = [os.open(real_root, _OPEN_DIR)]
    remaining = _components(relpath)
    links = 0
    try:
        while remaining:
            name = remaining.pop()
            if name in ("", "."):
                continue
            if name == "..":
                if len(folders) == 1:
                    raise outside
                os.close(folders.pop())
                continue
            last = not remaining
            try:
                fd = os.open(name, OPEN_READ if last else _OPEN_DIR, dir_fd=folders[-1])
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise
                target = _link_target(name, folders[-1])
                if target is None:
                    raise
                links += 1
                if links > MAX_SYMLINKS:
                    raise ToolError(f"{relpath}: too many levels of symbolic links") from None
                if os.path.isabs(target):
                    if target != real_root and not target.startswith(real_root.rstrip("/") + "/"):
                        raise outside from None
                    while len(folders) > 1:
                        os.close(folders.pop())
                    target = target[len(real_root) :]
                remaining.extend(_components(target))
                continue
            if last:
                try:
                    check_regular(fd, relpath)
                except BaseException:
                    os.close(fd)
                    raise
                return fd
            folders.append(fd)
        raise NotRegularFile(f"{relpath} is a folder, not a regular file")
    finally:
        for fd in folders:
            os.close(fd)


def _components(path: str) -> list[str]:
    """The parts of ``path`` in reverse order (the next one to open last)."""
    return list(reversed(path.split("/")))


def _link_target(name: str, dir_fd: int) -> str | None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    if not stat.S_ISLNK(st.st_mode):
        return None
    return os.readlink(name, dir_fd=dir_fd)
