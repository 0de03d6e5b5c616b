"""Large step outputs out of the row: a content-addressed blob store per database.

A step output whose JSON text is over ``NINELIVES_BLOB_THRESHOLD`` bytes
(default 64 KiB) is written to the blob store first, durably, and its row in
``steps.output`` holds only a reference, itself a JSON object::

    {"$blob": {"sha256": "<64 hex digits>", "size": <bytes>}}

On SQLite the blobs are files in ``<database>.blobs/`` named by their SHA-256
(written to a temporary file, fsynced, hard-linked to the name, the folder
fsynced: :func:`ninelives.diskio.write_new`); on PostgreSQL rows of the
``blobs`` and ``blob_chunks`` tables (migration 0008), committed before the
reference. Identical content is stored once. Every read checks the SHA-256: a
missing or different blob is :class:`~ninelives.errors.BlobDamaged` naming the
task and step, never a wrong value.

A real tool output could look like a reference. So an output whose only key
is ``"$blob"`` or ``"$raw"`` is stored escaped, as ``{"$raw": <output>}``, and
unwrapped when read: a row is a reference only when it is one.

A reference may also sit inside an output (``fetch`` of a file too large to
hold in memory returns its text as one); such nested references are kept by
:func:`sweep` and checked by :func:`check`, and read with :func:`open_ref`,
but are not resolved when a task is read.

For housekeeping (``gc``, ``doctor``): :func:`referenced`, :func:`unreferenced`,
:func:`sweep`, :func:`damaged` and :func:`check`. A temporary file of a blob
being stored on SQLite is named after the step's idempotency key
(``.<task>-<idx>.<hex>.tmp``) and written under that task's lock: it is an
orphan exactly when no live process holds that lock (:meth:`FolderBlobs.temps`).
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from . import diskio
from .errors import BlobDamaged, EffectUnknown, StoreError
from .errors import BlobUnreadable as BlobUnreadable  # its old home: kept importable
from .locking import check_lock_file, open_lock_file
from .models import load_json

if TYPE_CHECKING:
    from .models import Step, Task

REF_KEY = "$blob"
RAW_KEY = "$raw"
#: Outputs over this many bytes of JSON go to the blob store (``NINELIVES_BLOB_THRESHOLD``).
DEFAULT_THRESHOLD = 64 * 1024
#: Bytes per write, read and (on PostgreSQL) row of ``blob_chunks``.
CHUNK = 1 << 20
#: Seconds an unreferenced blob (or temporary file) is kept by :func:`sweep`:
#: a runner writes a blob and commits its reference a moment later.
GRACE = 3600.0
#: A SHA-256 hex digest; the only names a blob may have (compiled by re on first use).
_HEX64 = r"[0-9a-f]{64}"
_REF_PREFIX = '{"' + REF_KEY + '":'


class BlobRef(NamedTuple):
    """Which blob: its SHA-256 (hex) and its size in bytes."""

    sha256: str
    size: int

    def as_json(self) -> dict[str, Any]:
        """The reference as stored: ``{"$blob": {"sha256", "size"}}``."""
        return {REF_KEY: {"sha256": self.sha256, "size": self.size}}

    def short(self) -> str:
        """For messages: the first 12 hex digits and the size."""
        return f"{self.sha256[:12]}… ({self.size} bytes)"


def parse_ref(value: Any) -> BlobRef | None:
    """The reference ``value`` is, or None: exactly ``{"$blob": {"sha256", "size"}}``
    with 64 lowercase hex digits and a non-negative integer size."""
    if not isinstance(value, dict) or len(value) != 1:
        return None
    body = value.get(REF_KEY)
    if not isinstance(body, dict) or set(body) != {"sha256", "size"}:
        return None
    digest, size = body["sha256"], body["size"]
    if not isinstance(digest, str) or not re.fullmatch(_HEX64, digest):
        return None
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return None
    return BlobRef(digest, size)


def row_ref(text: str | None) -> BlobRef | None:
    """The reference a stored ``steps.output`` text is, or None (cheap for other rows)."""
    if text is None or not text.startswith(_REF_PREFIX) or len(text) > 200:
        return None
    try:
        return parse_ref(json.loads(text))
    except ValueError:
        return None


def needs_escape(output: Mapping[str, Any]) -> bool:
    """True for an output that a reader would take for a reference or an escape."""
    return len(output) == 1 and (REF_KEY in output or RAW_KEY in output)


def escape(encoded: str) -> str:
    """``{"$raw": <encoded>}``: the canonical JSON of the wrapped output."""
    return '{"' + RAW_KEY + '":' + encoded + "}"


def unescape(output: Any) -> Any:
    """What :func:`escape` wrapped: the output a reader finds under a stored
    ``{"$raw": <output>}``; any other value as it is."""
    if isinstance(output, dict) and len(output) == 1 and isinstance(output.get(RAW_KEY), dict):
        return output[RAW_KEY]
    return output


def nested_refs(value: Any) -> Iterator[BlobRef]:
    """Every reference anywhere inside ``value`` (a JSON value)."""
    if isinstance(value, dict):
        ref = parse_ref(value)
        if ref is not None:
            yield ref
            return
        for item in value.values():
            yield from nested_refs(item)
    elif isinstance(value, list):
        for item in value:
            yield from nested_refs(item)


class Blobs(Protocol):
    """A blob store: where one database keeps its large outputs."""

    def put(self, chunks: Iterable[bytes], *, tag: str | None = None) -> BlobRef:
        """Store the concatenated ``chunks`` durably (never more than one chunk
        in memory) and return its reference; content already stored is kept once.
        ``tag`` (a step's idempotency key) names temporary files. Raises
        :class:`~ninelives.errors.EffectUnknown` when the storage fails (EIO,
        a full disk), whatever ``chunks`` raises, and :class:`StoreError`."""
        ...

    def chunks(self, ref: BlobRef) -> Iterator[bytes]:
        """The blob's bytes in chunks, checked against ``ref`` before the first
        is given; :class:`BlobUnreadable` if missing or different."""
        ...

    def read(self, ref: BlobRef) -> bytes:
        """The whole blob, checked; :class:`BlobUnreadable` if missing or different."""
        ...

    def stored(self) -> list[tuple[str, int, float]]:
        """Every stored blob: ``(sha256, size, modified epoch seconds)``."""
        ...

    def delete(self, sha256: str, older_than: float) -> bool:
        """Delete the blob if it was last written before ``older_than`` (epoch
        seconds); True if it was deleted."""
        ...

    def remove_orphans(self, task_id: str) -> None:
        """Remove temporary files a killed run of ``task_id`` left (under its lock)."""
        ...

    def temps(self, older_than: float) -> list[tuple[str, int, float]]:
        """The temporary files whose writer is gone, ``(name, size, modified)``:
        one of a step whose task no live process holds, or an untagged one last
        written before ``older_than``. Never one a live writer may still write."""
        ...

    def remove_temp(self, name: str, older_than: float) -> bool:
        """Remove temporary file ``name`` if its writer is gone (checked again now);
        True if it is gone."""
        ...

    def remove_temps(self, older_than: float) -> list[str]:
        """Remove every temporary file whose writer is gone (:meth:`temps`); their names."""
        ...

    def check_writable(self) -> None:
        """Raise :class:`StoreError` unless a blob can be stored here now."""


#: What follows ``.TASK-`` in the name of a blob's temporary file (tag ``TASK-IDX``).
_TEMP_TAIL = re.compile(r"\d+\.[0-9a-f]{16}\.tmp")
#: A blob's temporary file: ``.<tag>.<16 hex>.tmp``; a tag ``TASK-IDX`` names its step.
_TEMP_NAME = re.compile(r"\.(.+)\.[0-9a-f]{16}\.tmp")
_STEP_TAG = re.compile(r"(.+)-\d+")


# -- resolving rows --------------------------------------------------------------


def resolve_step(step: Step, blobs: Blobs | None) -> Step:
    """The step with its output as the tool returned it: an escaped output
    unwrapped, a reference read from ``blobs`` and checked (``output_blob``
    then holds the reference). :class:`BlobDamaged` if the blob is missing or
    different, or there is no blob store to read it from."""
    output = step.output
    if output is None or len(output) != 1:
        return step
    if (unescaped := unescape(output)) is not output:
        return step._replace(output=unescaped)
    ref = parse_ref(output)
    if ref is None:
        return step
    where = f"task {step.task_id!r} step {step.idx}"
    try:
        if blobs is None:
            raise BlobUnreadable("this store has no blob store to read it from")
        data = blobs.read(ref)
        value = load_json(data.decode("utf-8"))
    except (BlobUnreadable, ValueError) as exc:
        raise BlobDamaged(
            f"{where}: its output blob {ref.sha256} ({ref.size} bytes) cannot be used: {exc}; "
            "the task cannot be run or shown until the blob is restored (copy the "
            "database's blob folder or table with it)",
            task_id=step.task_id,
            step=step.idx,
        ) from exc
    value = unescape(value)
    if not isinstance(value, dict):
        value = {"value": value}
    return step._replace(output=value, output_blob=ref._asdict())


def resolve_task(task: Task, blobs: Blobs | None) -> Task:
    """The task with every step's output resolved (:func:`resolve_step`)."""
    steps = tuple(resolve_step(step, blobs) for step in task.steps)
    unchanged = all(a is b for a, b in zip(steps, task.steps, strict=True))
    return task if unchanged else task._replace(steps=steps)


# -- the blob store of the current run (for tools) ---------------------------------

#: ``(blob store, task id)`` of the step being run, set by the runtime around its steps.
CURRENT: ContextVar[tuple[Blobs, str] | None] = ContextVar("ninelives_blobs", default=None)


def current() -> Blobs | None:
    """The blob store of the task being run, or None outside a run."""
    found = CURRENT.get()
    return found[0] if found is not None else None


def open_ref(ref: BlobRef | Mapping[str, Any]) -> Iterator[bytes]:
    """Inside a step: the chunks of a blob that an output refers to (such as
    ``fetch``'s ``text`` for a large file), checked before the first is given.
    :class:`BlobDamaged` if it is missing or different."""
    found = CURRENT.get()
    parsed = ref if isinstance(ref, BlobRef) else parse_ref(dict(ref))
    if parsed is None:
        from .errors import ToolError

        raise ToolError(f"not a blob reference: {ref!r}")
    if found is None:
        raise StoreError("blobs are read inside a step only (no task is being run)")
    store, task_id = found
    try:
        return store.chunks(parsed)
    except BlobUnreadable as exc:
        raise BlobDamaged(
            f"task {task_id!r}: blob {parsed.short()} cannot be used: {exc}",
            task_id=task_id,
            step=None,
        ) from exc


# -- SQLite: files beside the database ----------------------------------------------


def folder_for(db_path: str) -> str:
    """The blob folder of the SQLite database at (real path) ``db_path``."""
    return db_path + ".blobs"


class FolderBlobs:
    """Blobs as files named by their SHA-256 in one folder (0700, files 0600).

    Names are 64 hex digits only, so no reference can name a path outside it.
    Reading never creates the folder (the read-only commands use this too).
    """

    def __init__(
        self,
        folder: str,
        lock_file: str | None = None,
        *,
        held: Callable[[str], bool] | None = None,
    ) -> None:
        self.folder = folder
        #: Writers hold it shared while they store or find a blob, a sweep holds it
        #: exclusive while it deletes one: a blob found by a writer is never swept
        #: between the finding and the refreshing of its time. None: no lock (readers).
        self.lock_file = lock_file
        #: Whether a live process holds a task's lock: a step's blob is written
        #: under it, so its temporary file is an orphan once nobody holds it.
        #: None: unknown (temporary files then go by age alone).
        self.held = held

    @contextmanager
    def _locked(self, *, exclusive: bool) -> Iterator[None]:
        if self.lock_file is None:
            yield
            return
        import fcntl

        fd = open_lock_file(self.lock_file)  # as the task locks: never through a link
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    def _path(self, sha256: str) -> str:
        if not re.fullmatch(_HEX64, sha256):
            raise BlobUnreadable(f"{sha256!r} is not a SHA-256 hex digest")
        return os.path.join(self.folder, sha256)

    def put(self, chunks: Iterable[bytes], *, tag: str | None = None) -> BlobRef:
        self.check_writable()
        temp = f".{tag or 'blob'}.{os.urandom(8).hex()}.tmp"
        try:
            with self._locked(exclusive=False):
                published = diskio.write_new(self.folder, temp, chunks, private=True)
        except OSError as exc:
            if exc.errno in diskio.STORAGE_ERRNOS:
                raise EffectUnknown(
                    f"storing a blob in {self.folder} failed ({exc.strerror}), stopping: "
                    "the next run recovers"
                ) from exc
            raise StoreError(f"cannot store a blob in {self.folder}: {exc.strerror}") from exc
        return BlobRef(published.sha256, published.size)

    def check_writable(self) -> None:
        why = diskio.unusable_folder(self.folder)
        if why is not None:
            raise StoreError(f"blob folder {self.folder} {why}; refusing to store there")
        check_lock_file(self.lock_file)

    def _refuse_link(self, what: str) -> None:
        if os.path.islink(self.folder):  # as for the lock folder: never through a link
            raise StoreError(f"blob folder {self.folder} is a symlink; refusing to {what} there")

    def _open_checked(self, ref: BlobRef) -> int:
        from . import files

        path = self._path(ref.sha256)
        try:
            fd = files.open_regular(path, shown=f"blob {ref.sha256}")
        except FileNotFoundError:
            raise BlobUnreadable(f"blob file {path} is missing") from None
        except (OSError, files.NotRegularFile) as exc:
            raise BlobUnreadable(f"blob file {path} cannot be read: {exc}") from None
        try:
            digest, size = files.sha256_of(fd)
            if (digest, size) != (ref.sha256, ref.size):
                raise BlobUnreadable(
                    f"blob file {path} holds {size} bytes whose SHA-256 is not the reference's"
                )
            os.lseek(fd, 0, os.SEEK_SET)
        except OSError as exc:
            os.close(fd)
            raise BlobUnreadable(f"blob file {path} cannot be read: {exc.strerror}") from None
        except BaseException:
            os.close(fd)
            raise
        return fd

    def chunks(self, ref: BlobRef) -> Iterator[bytes]:
        fd = self._open_checked(ref)  # before the generator: errors come at once

        def give() -> Iterator[bytes]:
            try:
                while chunk := os.read(fd, CHUNK):
                    yield chunk
            finally:
                os.close(fd)

        return give()

    def read(self, ref: BlobRef) -> bytes:
        return b"".join(self.chunks(ref))

    def stored(self) -> list[tuple[str, int, float]]:
        found = []
        try:
            entries = list(os.scandir(self.folder))
        except FileNotFoundError:
            return []
        except OSError as exc:  # a file or a FIFO where the folder should be
            raise StoreError(f"blob folder {self.folder} cannot be read: {exc.strerror}") from None
        for entry in entries:
            if re.fullmatch(_HEX64, entry.name):
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode):  # a folder or a link there is no blob of ours
                    found.append((entry.name, st.st_size, st.st_mtime))
        return sorted(found)

    def delete(self, sha256: str, older_than: float) -> bool:
        path = self._path(sha256)
        self._refuse_link("remove blobs")
        with self._locked(exclusive=True):
            try:
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode) or st.st_mtime >= older_than:
                    return False
                os.unlink(path)
            except FileNotFoundError:
                return False
            except OSError as exc:  # a folder this user cannot write, a read-only mount
                raise StoreError(f"cannot remove blob {path}: {exc.strerror}") from None
        diskio.fsync_dir(self.folder)
        return True

    def remove_orphans(self, task_id: str) -> None:
        prefix = f".{task_id}-"  # a prefix test first: no pattern compiled per task
        try:
            names = os.listdir(self.folder)
        except OSError:
            return  # nothing to clean that we can see; never stops a run
        for name in names:
            if name.startswith(prefix) and _TEMP_TAIL.fullmatch(name, len(prefix)) is not None:
                try:
                    os.unlink(os.path.join(self.folder, name))
                except OSError:
                    continue

    def _writer_gone(self, name: str, modified: float, older_than: float) -> bool:
        found = _TEMP_NAME.fullmatch(name)
        if found is None:
            return False
        step = _STEP_TAG.fullmatch(found.group(1))
        if step is not None and self.held is not None:
            return not self.held(step.group(1))
        return modified < older_than

    def temps(self, older_than: float) -> list[tuple[str, int, float]]:
        found = []
        try:
            entries = list(os.scandir(self.folder))
        except OSError:
            return []
        for entry in entries:
            if not _TEMP_NAME.fullmatch(entry.name):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and self._writer_gone(entry.name, st.st_mtime, older_than):
                found.append((entry.name, st.st_size, st.st_mtime))
        return sorted(found)

    def remove_temp(self, name: str, older_than: float) -> bool:
        if os.sep in name or not _TEMP_NAME.fullmatch(name):
            return False
        self._refuse_link("remove files")
        path = os.path.join(self.folder, name)
        try:
            if not self._writer_gone(name, os.lstat(path).st_mtime, older_than):
                return False
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError:
            return False
        return True

    def remove_temps(self, older_than: float) -> list[str]:
        return [n for n, _, _ in self.temps(older_than) if self.remove_temp(n, older_than)]


# -- housekeeping: gc and doctor ------------------------------------------------------


class Reference(NamedTuple):
    """A blob some step refers to: the task, the step and the reference."""

    task_id: str
    step: int
    ref: BlobRef
    #: True when the step's whole output is the blob; False for one inside an output.
    whole: bool


def references(store: Any) -> list[Reference]:
    """Every blob reference in ``store``: each row that is a reference, and every
    reference inside an output (inline, or inside an output blob that is readable).

    Reads rows through ``store.blob_rows()``; never loads an output that holds no
    reference."""
    found: list[Reference] = []
    blobs: Blobs = store.blobs
    for task_id, idx, text in store.blob_rows():
        ref = row_ref(text)
        if ref is not None:
            found.append(Reference(task_id, idx, ref, True))
            try:
                body = blobs.read(ref)
            except BlobUnreadable:
                continue  # check() reports it; its contents are unknown
            if REF_KEY.encode() not in body:
                continue
            text = body.decode("utf-8", "replace")
        try:
            # Depth-checked: a row nested past any reader (an older version, a
            # hand edit) is that task damaged, not a gc or doctor that crashes.
            value: Any = load_json(text)
        except ValueError:
            continue
        if isinstance(value, dict) and len(value) == 1 and isinstance(value.get(RAW_KEY), dict):
            # An escaped output: its top level only looked like a reference.
            value = list(value[RAW_KEY].values())
        found.extend(Reference(task_id, idx, r, False) for r in nested_refs(value))
    return found


def referenced(store: Any) -> set[str]:
    """The SHA-256 of every blob that some step of ``store`` refers to."""
    return {r.ref.sha256 for r in references(store)}


def unreferenced(store: Any, older_than: float) -> list[tuple[str, int, float]]:
    """``(sha256, size, modified)`` of every blob nobody refers to that was last
    written before ``older_than`` (epoch seconds)."""
    keep = referenced(store)
    return [b for b in store.blobs.stored() if b[0] not in keep and b[2] < older_than]


def sweep(
    store: Any, *, grace: float = GRACE, now: float | None = None, temps: bool = True
) -> list[str]:
    """Delete the blobs nobody refers to that were last written more than
    ``grace`` seconds ago (and, with ``temps``, the temporary files whose
    writer is gone: :meth:`Blobs.remove_temps`); return their hashes.

    Safe beside running runners: a runner writes (or, for content already
    stored, touches) its blob just before committing the reference, so a blob
    younger than ``grace`` is kept even when the reference is not committed
    yet. ``grace`` must exceed that moment (seconds); the default is an hour.
    """
    cutoff = (time.time() if now is None else now) - grace
    removed = [
        sha256
        for sha256, _size, _modified in unreferenced(store, cutoff)
        if store.blobs.delete(sha256, cutoff)
    ]
    if temps:
        store.blobs.remove_temps(cutoff)
    return removed


def damaged(store: Any) -> list[tuple[Reference, str]]:
    """Every referenced blob that is missing or does not match its reference
    (read whole and hashed), with why."""
    problems = []
    blobs: Blobs = store.blobs
    for reference in references(store):
        try:
            for _ in blobs.chunks(reference.ref):
                pass
        except BlobUnreadable as exc:
            problems.append((reference, str(exc)))
    return problems


def check(store: Any) -> list[str]:
    """One line per referenced blob that is missing or does not match its
    reference, naming the task and step; empty when every blob is sound."""
    return [
        f"task {reference.task_id!r} step {reference.step}: {describe(reference)}: {why}"
        for reference, why in damaged(store)
    ]


def describe(reference: Reference) -> str:
    """``output blob <short>`` or ``a blob its output refers to, <short>``."""
    what = "output blob" if reference.whole else "a blob its output refers to,"
    return f"{what} {reference.ref.short()}"
