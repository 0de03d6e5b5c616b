"""A file layer that knows what survives a power cut.

A SIGKILL keeps the page cache; a power cut keeps only what was made durable.
:class:`DiskModel` follows every write, truncate, sync, create, link, unlink and
mkdir under one folder with the POSIX rules:

* a file's bytes are durable once that file is fsynced (``fsync``/``fdatasync``);
* a name (created, linked, unlinked) is durable once its folder is fsynced.

At a cut, :meth:`DiskModel.survivors` says what a restarted machine finds:
only durable state, or (``torn``) durable state plus a random part of what was
still pending: each unsynced write lands whole with a probability chosen per
cut (30%, 80% or 98%), else is dropped or torn at 512-byte sectors (SQLite
assumes no more: a write never damages bytes outside its own range); and a
random prefix of the unsynced folder changes lands (a journaling file system
commits its metadata in order).
:meth:`DiskModel.rebuild` then rewrites the folder to that state.

Two front ends feed the model:

* :class:`RecordingVFS`, an apsw VFS over the default ``unix`` one, under which
  SQLite keeps the database, its WAL and its rollback journal. The WAL index
  (``-shm``) is never durable state: SQLite rebuilds it, so a cut deletes it.
* :class:`EffectsOS`, which stands in for the ``os`` module of
  :mod:`ninelives.tools.effects` (artifact files and their folder).

Real fsyncs are skipped: the model, not the disk, decides what survives.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import apsw

SECTOR = 512
#: Folders and files the model leaves alone: lock files die with their process,
#: and the WAL index is rebuilt by SQLite.
_UNTRACKED_SUFFIXES = (".locks", "-shm")


class PowerCut(BaseException):
    """The power went at this operation. A BaseException, so no ``except Exception``
    in the runtime or a tool can swallow it."""


@dataclass(eq=False)
class FileNode:
    """One inode: bytes that survive a cut, and writes/truncates not yet synced."""

    durable: bytearray = field(default_factory=bytearray)
    pending: list[tuple[int, bytes | None]] = field(default_factory=list)


@dataclass(eq=False)
class DirNode:
    """One folder: names that survive a cut, and name changes not yet synced."""

    durable: dict[str, FileNode | DirNode] = field(default_factory=dict)
    current: dict[str, FileNode | DirNode] = field(default_factory=dict)
    pending: list[tuple[str, FileNode | DirNode | None]] = field(default_factory=list)

    def set(self, name: str, node: FileNode | DirNode | None) -> None:
        self.pending.append((name, node))
        if node is None:
            self.current.pop(name, None)
        else:
            self.current[name] = node


def _apply(buf: bytearray, op: tuple[int, bytes | None]) -> None:
    offset, data = op
    if data is None:  # truncate to `offset` bytes
        del buf[offset:]
        buf.extend(bytes(max(0, offset - len(buf))))
        return
    if offset > len(buf):
        buf.extend(bytes(offset - len(buf)))
    buf[offset : offset + len(data)] = data


def _torn(
    op: tuple[int, bytes | None], rng: random.Random, keep: float
) -> list[tuple[int, bytes | None]]:
    """The parts of one pending operation that reached the platter: all of it
    with probability ``keep``, else none or a random subset of its sectors."""
    offset, data = op
    if rng.random() < keep:
        return [op]
    if data is None or rng.random() < 0.5:
        return []
    pieces: list[tuple[int, bytes | None]] = []
    start = offset
    while start < offset + len(data):
        end = min(offset + len(data), (start // SECTOR + 1) * SECTOR)
        if rng.random() < 0.5:
            pieces.append((start, data[start - offset : end - offset]))
        start = end
    return pieces


class DiskModel:
    """The durability model of one folder tree. See the module docstring."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.tree = DirNode()
        self.known: set[str] = set()

    @classmethod
    def scan(cls, root: str) -> DiskModel:
        """A model of ``root`` as it is now, all of it durable (a clean start)."""
        model = cls(root)

        def walk(folder: str, node: DirNode) -> None:
            for entry in sorted(os.scandir(folder), key=lambda e: e.name):
                if entry.name.endswith(_UNTRACKED_SUFFIXES) or entry.is_symlink():
                    continue
                child: FileNode | DirNode
                if entry.is_dir():
                    child = DirNode()
                    walk(entry.path, child)
                else:
                    with open(entry.path, "rb") as fh:
                        child = FileNode(durable=bytearray(fh.read()))
                node.durable[entry.name] = node.current[entry.name] = child
                model.known.add(model.rel(entry.path))

        walk(model.root, model.tree)
        return model

    # -- paths -------------------------------------------------------------

    def covers(self, path: str) -> bool:
        """True for a path inside the modelled tree."""
        full = os.path.abspath(path)
        if full == self.root:
            return True
        if not full.startswith(self.root + os.sep):
            return False
        return not any(p.endswith(_UNTRACKED_SUFFIXES) for p in self.rel(full).split(os.sep))

    def rel(self, path: str) -> str:
        """``path`` relative to the root."""
        return os.path.relpath(os.path.abspath(path), self.root)

    def lookup(self, path: str) -> FileNode | DirNode | None:
        """The node a path names now (page-cache view), or None."""
        node: FileNode | DirNode | None = self.tree
        rel = self.rel(path)
        if rel == os.curdir:
            return node
        for part in rel.split(os.sep):
            if not isinstance(node, DirNode):
                return None
            node = node.current.get(part)
        return node

    def _parent(self, path: str) -> tuple[DirNode, str]:
        folder, name = os.path.split(os.path.abspath(path))
        parent = self.tree if folder == self.root else self.lookup(folder)
        if not isinstance(parent, DirNode):
            raise FileNotFoundError(f"power-loss model: no folder {folder}")
        return parent, name

    # -- operations ----------------------------------------------------------

    def create(self, path: str, content: bytes = b"") -> FileNode:
        """A new file at ``path``: its name and ``content`` are both pending."""
        parent, name = self._parent(path)
        node = FileNode()
        if content:
            node.pending.append((0, bytes(content)))
        parent.set(name, node)
        self.known.add(self.rel(path))
        return node

    def mkdir(self, path: str) -> None:
        """A new folder at ``path`` (its name pending in its parent)."""
        parent, name = self._parent(path)
        parent.set(name, DirNode())
        self.known.add(self.rel(path))

    def link(self, src: str, dst: str) -> None:
        """A second name for the inode at ``src``."""
        node = self.lookup(src)
        if node is None:
            raise FileNotFoundError(src)
        parent, name = self._parent(dst)
        parent.set(name, node)
        self.known.add(self.rel(dst))

    def unlink(self, path: str) -> None:
        """Remove a name (pending until its folder is synced)."""
        parent, name = self._parent(path)
        parent.set(name, None)

    @staticmethod
    def write(node: FileNode, offset: int, data: bytes) -> None:
        """Record a write into the page cache."""
        node.pending.append((offset, bytes(data)))

    @staticmethod
    def truncate(node: FileNode, size: int) -> None:
        """Record a truncate (or extension with zeros) to ``size`` bytes."""
        node.pending.append((size, None))

    @staticmethod
    def sync(node: FileNode) -> None:
        """fsync/fdatasync of a file: its bytes and size become durable."""
        for op in node.pending:
            _apply(node.durable, op)
        node.pending.clear()

    @staticmethod
    def sync_dir(node: DirNode) -> None:
        """fsync of a folder: its names become durable."""
        node.durable = dict(node.current)
        node.pending.clear()

    def dir_of(self, path: str) -> DirNode:
        """The folder node holding ``path``."""
        return self._parent(path)[0]

    # -- the cut -------------------------------------------------------------

    def survivors(self, rng: random.Random | None = None) -> dict[str, bytes | None]:
        """What a restarted machine finds: relative path -> bytes (None: a folder).

        Without ``rng``, only durable state; with it, a torn random part of the
        pending state as well (see the module docstring).
        """
        found: dict[str, bytes | None] = {}
        contents: dict[int, bytes] = {}
        # How much of the pending state landed varies from cut to cut.
        keep = rng.choice((0.3, 0.8, 0.98)) if rng is not None else 0.0

        def content(node: FileNode) -> bytes:
            if id(node) not in contents:
                buf = bytearray(node.durable)
                for op in node.pending:
                    if rng is None:
                        break
                    for piece in _torn(op, rng, keep):
                        _apply(buf, piece)
                contents[id(node)] = bytes(buf)
            return contents[id(node)]

        def walk(node: DirNode, prefix: str) -> None:
            entries = dict(node.durable)
            if rng is not None and node.pending:
                for name, child in node.pending[: rng.randint(0, len(node.pending))]:
                    if child is None:
                        entries.pop(name, None)
                    else:
                        entries[name] = child
            for name, child in sorted(entries.items()):
                path = os.path.join(prefix, name) if prefix else name
                if isinstance(child, DirNode):
                    found[path] = None
                    walk(child, path)
                else:
                    found[path] = content(child)

        walk(self.tree, "")
        return found

    def rebuild(self, survivors: dict[str, bytes | None]) -> None:
        """Rewrite the folder to ``survivors``; paths the model never saw are kept."""
        for rel in sorted(self.known, key=lambda p: -p.count(os.sep)):
            path = os.path.join(self.root, rel)
            if rel in survivors or not os.path.lexists(path):
                continue
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        for rel, data in sorted(survivors.items(), key=lambda item: item[0].count(os.sep)):
            path = os.path.join(self.root, rel)
            if data is None:
                if os.path.isdir(path):
                    continue
                if os.path.lexists(path):
                    os.unlink(path)
                os.mkdir(path)
            else:
                if os.path.isdir(path):
                    shutil.rmtree(path)
                with open(path, "wb") as fh:
                    fh.write(data)
        for dirpath, dirnames, filenames in os.walk(self.root):
            for name in filenames + dirnames:
                if name.endswith("-shm"):
                    os.unlink(os.path.join(dirpath, name))


class Trigger:
    """Counts durable-state operations and cuts the power at operation ``cut_at`` (1-based).

    The operation at the cut does not happen. Afterwards the machine is dead:
    the VFS ignores every further write, the ``os`` stand-in raises.
    """

    def __init__(self, cut_at: int | None = None) -> None:
        self.cut_at = cut_at
        self.count = 0
        self.dead = False
        self.ops: list[str] = []

    def tick(self, kind: str, where: str) -> None:
        """Count one operation; raise :class:`PowerCut` if it is the chosen one."""
        if self.dead:
            raise PowerCut("the power is already off")
        self.count += 1
        self.ops.append(f"{kind} {where}")
        if self.count == self.cut_at:
            self.dead = True
            raise PowerCut(f"power cut at operation {self.count}: {kind} {where}")


# Files whose first sync also fsyncs their folder in SQLite's unix VFS
# (UNIXFILE_DIRSYNC: a journal or WAL opened with SQLITE_OPEN_CREATE).
_DIRSYNC_KINDS = (
    apsw.SQLITE_OPEN_WAL | apsw.SQLITE_OPEN_MAIN_JOURNAL | apsw.SQLITE_OPEN_SUPER_JOURNAL
)


class RecordingVFS(apsw.VFS):
    """An apsw VFS over ``unix`` that feeds a :class:`DiskModel` and a :class:`Trigger`.

    Set :attr:`model` and :attr:`trigger` before opening a connection with
    ``vfs=NAME``; files outside the model's folder pass straight through.
    """

    NAME = "ninelives-powerloss"

    def __init__(self) -> None:
        self.model: DiskModel | None = None
        self.trigger = Trigger()
        #: SQLite's own folder fsync (at a new WAL or journal's first sync) fails
        #: and SQLite ignores the error, as its unix VFS does: no name becomes durable.
        self.dirsync_lost = False
        super().__init__(self.NAME, "")

    def xOpen(self, name: str | apsw.URIFilename | None, flags: list[int]) -> apsw.VFSFile:
        return RecordingFile(self, name, flags)

    def xDelete(self, filename: str, syncdir: bool) -> None:
        model = self.model
        if model is None or not model.covers(filename):
            super().xDelete(filename, syncdir)
            return
        if self.trigger.dead:
            return
        self.trigger.tick("delete", model.rel(filename))
        super().xDelete(filename, syncdir)
        model.unlink(filename)
        if syncdir:
            self.trigger.tick("dirsync", model.rel(os.path.dirname(filename)) or ".")
            model.sync_dir(model.dir_of(filename))


class RecordingFile(apsw.VFSFile):
    """One file opened by SQLite: writes go to the real file and to the model."""

    def __init__(self, vfs: RecordingVFS, name: str | apsw.URIFilename | None, flags: list[int]):
        path = name.filename() if isinstance(name, apsw.URIFilename) else name
        super().__init__("", name, flags)
        self._vfs = vfs
        self._node: FileNode | None = None
        self._path = os.path.abspath(path) if path else ""
        model = vfs.model
        if model is not None and path and model.covers(path):
            node = model.lookup(path)
            if not isinstance(node, FileNode):
                # New to the model: created now (by SQLite, or by the store
                # just before), so its name is not durable yet.
                with open(path, "rb") as fh:
                    node = model.create(path, fh.read())
            self._node = node
        self._dirsync = bool(flags[0] & apsw.SQLITE_OPEN_CREATE and flags[0] & _DIRSYNC_KINDS)

    def _where(self) -> str:
        model = self._vfs.model
        return model.rel(self._path) if model is not None else self._path

    def xWrite(self, data: bytes, offset: int) -> None:
        if self._node is None:
            return super().xWrite(data, offset)
        if self._vfs.trigger.dead:
            return None
        self._vfs.trigger.tick("write", self._where())
        super().xWrite(data, offset)
        DiskModel.write(self._node, offset, bytes(data))
        return None

    def xTruncate(self, newsize: int) -> None:
        if self._node is None:
            return super().xTruncate(newsize)
        if self._vfs.trigger.dead:
            return None
        self._vfs.trigger.tick("truncate", self._where())
        super().xTruncate(newsize)
        DiskModel.truncate(self._node, newsize)
        return None

    def xSync(self, flags: int) -> None:
        if self._node is None:
            return super().xSync(flags)
        model, trigger = self._vfs.model, self._vfs.trigger
        if trigger.dead or model is None:
            return None
        trigger.tick("sync", self._where())
        DiskModel.sync(self._node)
        if self._dirsync and not self._vfs.dirsync_lost:
            trigger.tick("dirsync", model.rel(os.path.dirname(self._path)) or ".")
            model.sync_dir(model.dir_of(self._path))
        self._dirsync = False
        return None


_vfs: RecordingVFS | None = None


def recording_vfs() -> RecordingVFS:
    """The process's one :class:`RecordingVFS` (registered on first use)."""
    global _vfs
    if _vfs is None:
        _vfs = RecordingVFS()
    return _vfs


class EffectsOS:
    """Stands in for ``os`` inside :mod:`ninelives.tools.effects` and
    :mod:`ninelives.diskio`, feeding the model.

    ``drop_file_fsync`` / ``drop_dir_fsync`` turn those fsyncs into no-ops:
    negative controls that show the harness sees a missing fsync; with
    ``drop_under`` (a folder relative to the model's root) only there.
    """

    def __init__(
        self,
        model: DiskModel,
        trigger: Trigger,
        *,
        drop_file_fsync: bool = False,
        drop_dir_fsync: bool = False,
        drop_under: str | None = None,
    ) -> None:
        self._model = model
        self._trigger = trigger
        self._drop_file_fsync = drop_file_fsync
        self._drop_dir_fsync = drop_dir_fsync
        #: When set, the drops apply only to paths at or under this relative folder.
        self._drop_under = drop_under
        self._fds: dict[int, tuple[str, FileNode | DirNode, bool]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def open(self, path: str, flags: int, mode: int = 0o777) -> int:
        model = self._model
        if not model.covers(path):
            return os.open(path, flags, mode)
        creating = bool(flags & os.O_CREAT) and model.lookup(path) is None
        if self._trigger.dead:
            raise PowerCut("the power is off")
        fd = os.open(path, flags, mode)
        node = model.create(path) if creating else model.lookup(path)
        if node is not None:
            self._fds[fd] = (model.rel(path), node, bool(flags & os.O_APPEND))
        return fd

    def close(self, fd: int) -> None:
        self._fds.pop(fd, None)
        os.close(fd)

    def write(self, fd: int, data: Any) -> int:
        tracked = self._fds.get(fd)
        if tracked is None:
            return os.write(fd, data)
        where, node, append = tracked
        self._trigger.tick("write", where)
        offset = os.fstat(fd).st_size if append else os.lseek(fd, 0, os.SEEK_CUR)
        written = os.write(fd, data)
        if isinstance(node, FileNode):
            DiskModel.write(node, offset, bytes(data[:written]))
        return written

    def fsync(self, fd: int) -> None:
        tracked = self._fds.get(fd)
        if tracked is None:
            os.fsync(fd)
            return
        where, node, _ = tracked
        under = self._drop_under
        dropping = under is None or where == under or where.startswith(under + os.sep)
        if isinstance(node, DirNode):
            if not (self._drop_dir_fsync and dropping):
                self._trigger.tick("dirsync", where)
                DiskModel.sync_dir(node)
        elif not (self._drop_file_fsync and dropping):
            self._trigger.tick("sync", where)
            DiskModel.sync(node)

    def link(self, src: str, dst: str, *, follow_symlinks: bool = True) -> None:
        if not self._model.covers(dst):
            os.link(src, dst, follow_symlinks=follow_symlinks)
            return
        self._trigger.tick("link", self._model.rel(dst))
        os.link(src, dst, follow_symlinks=follow_symlinks)
        self._model.link(src, dst)

    def unlink(self, path: str) -> None:
        if not self._model.covers(path):
            os.unlink(path)
            return
        self._trigger.tick("unlink", self._model.rel(path))
        os.unlink(path)
        self._model.unlink(path)

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        if not self._model.covers(path):
            os.mkdir(path, mode)
            return
        self._trigger.tick("mkdir", self._model.rel(path))
        os.mkdir(path, mode)
        self._model.mkdir(path)

    def makedirs(self, name: str, mode: int = 0o777, exist_ok: bool = False) -> None:
        full = os.path.abspath(name)
        if os.path.isdir(full):
            if not exist_ok:
                raise FileExistsError(full)
            return
        parent = os.path.dirname(full)
        if parent != full and not os.path.isdir(parent):
            self.makedirs(parent, mode, exist_ok=True)
        self.mkdir(full, mode)


@contextmanager
def store_through(proxy: EffectsOS) -> Iterator[None]:
    """Route the ``os`` calls of :mod:`ninelives.store.sqlite.base` (its own fsync of the
    database folder, the file it creates) through ``proxy`` for the block."""
    from ..store.sqlite import base as store_module

    namespace = vars(store_module)
    saved = namespace["os"]
    namespace["os"] = proxy
    try:
        yield
    finally:
        namespace["os"] = saved


@contextmanager
def effects_through(proxy: EffectsOS, *, plain_mkdir: bool = False) -> Iterator[None]:
    """Route :mod:`ninelives.tools.effects` and the durable primitives it writes
    with (:mod:`ninelives.diskio`) through ``proxy`` for the block.

    ``plain_mkdir`` makes the artifact folder without fsyncing its parent
    (a negative control: the folder, and every artifact in it, can vanish).
    """
    from .. import diskio
    from ..tools import effects

    # The modules' own global `os` is swapped, so only they see the proxy.
    spaces = (vars(effects), vars(diskio))
    saved = [space["os"] for space in spaces]
    saved_make = diskio.make_folder
    for space in spaces:
        space["os"] = proxy
    if plain_mkdir:

        def plain(folder: str, mode: int = 0o777) -> None:
            proxy.makedirs(folder, mode, exist_ok=True)

        diskio.make_folder = plain
    try:
        yield
    finally:
        for space, was in zip(spaces, saved, strict=True):
            space["os"] = was
        diskio.make_folder = saved_make
