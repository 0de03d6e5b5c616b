"""The PostgreSQL blob store (:mod:`ninelives.blobs`): the ``blobs`` and
``blob_chunks`` tables of migration 0008.

A blob is written in one transaction of its own, committed before the ``done``
commit that refers to it: its chunks are inserted under a temporary key while
they are hashed (one chunk in memory at a time), then either renamed to the
hash with a ``blobs`` row, or dropped when that content is already stored
(whose ``created_at`` is then refreshed, so that a sweep spares it; the row
lock orders the two, so a blob is never swept under a writer that found it).
Content found stored is checked first: damaged (chunks lost or changed), it is
replaced by the writer's chunks, as a damaged blob file is on SQLite. A writer
killed mid-way leaves nothing: its transaction rolls back. Blob writes are not
fenced: they change no task's state, and a blob nobody refers to is swept.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import psycopg

from ...blobs import CHUNK, BlobRef
from ...errors import BlobUnreadable, CommitUnknown, StoreError
from .base import Q

if TYPE_CHECKING:
    from .base import Conn, Session

#: Chunks fetched per query when reading a blob.
_READ_BATCH = 2


class TableBlobs:
    """Blobs in the database itself, on the store's own session."""

    def __init__(self, session: Session, conn: Conn | None = None) -> None:
        self._session = session
        self._conn = conn

    def check_writable(self) -> None:
        """Nothing to check before a claim: the blobs are rows of this database."""

    def on(self, conn: Conn) -> TableBlobs:
        """This store reading through ``conn``, inside a transaction already open
        (a task's outputs are resolved in the snapshot its rows were read in)."""
        return TableBlobs(self._session, conn)

    @contextmanager
    def _transaction(self) -> Iterator[Conn]:
        """A plain transaction (not pipelined: a blob's chunks are sent one by one,
        so the client never buffers more than one)."""
        session = self._session
        conn = session._connection()
        committing = False
        try:
            conn.execute("BEGIN")
            yield conn
            committing = True
            conn.execute("COMMIT")
        except BaseException as exc:
            if committing:
                session._drop()
            else:
                session._rollback(conn)
            if isinstance(exc, psycopg.Error):
                why = session._why(exc)
                if committing:
                    raise CommitUnknown(
                        f"commit of a blob to {session._shown} failed ({why}); its outcome "
                        "is unknown, stopping now: the next run recovers"
                    ) from exc
                raise StoreError(f"database {session._shown}: {why}") from exc
            raise

    def put(self, chunks: Iterable[bytes], *, tag: str | None = None) -> BlobRef:
        import hashlib  # ~10 ms to import (OpenSSL): only when a blob is written

        key = f"tmp-{os.urandom(16).hex()}"
        digest = hashlib.sha256()
        size = 0
        with self._transaction() as conn:
            n = 0
            for chunk in _rechunk(chunks):
                digest.update(chunk)
                size += len(chunk)
                conn.execute(Q["blob_chunk_insert"], {"key": key, "n": n, "data": chunk})
                n += 1
            ref = BlobRef(digest.hexdigest(), size)
            new = conn.execute(Q["blob_insert"], ref._asdict()).fetchone()
            if new is None or not new[0]:
                if self._intact(conn, ref):
                    conn.execute(Q["blob_chunks_drop"], {"key": key})
                    return ref
                # Stored but damaged (chunks lost or changed): these bytes are
                # what its name says, so they replace it, as a damaged blob file is.
                conn.execute(Q["blob_chunks_drop"], {"key": ref.sha256})
            conn.execute(Q["blob_chunks_rename"], {"key": key, "sha256": ref.sha256})
        return ref

    def _intact(self, conn: Conn, ref: BlobRef) -> bool:
        """Whether the chunks stored under ``ref`` hold what its name says."""
        import hashlib

        digest = hashlib.sha256()
        size = 0
        for chunk in TableBlobs(self._session, conn)._raw(ref.sha256):
            digest.update(chunk)
            size += len(chunk)
        return (digest.hexdigest(), size) == (ref.sha256, ref.size)

    def chunks(self, ref: BlobRef) -> Iterator[bytes]:
        import hashlib

        # Checked in full first, then given: a consumer never sees a wrong byte.
        digest = hashlib.sha256()
        size = 0
        for chunk in self._raw(ref.sha256):
            digest.update(chunk)
            size += len(chunk)
        if size == 0 and ref.size:
            raise BlobUnreadable(f"blob {ref.sha256} is missing from the blob_chunks table")
        if (digest.hexdigest(), size) != (ref.sha256, ref.size):
            raise BlobUnreadable(
                f"blob {ref.sha256} holds {size} bytes whose SHA-256 is not the reference's"
            )
        return self._raw(ref.sha256)

    def _raw(self, sha256: str) -> Iterator[bytes]:
        start = 0
        while True:
            params = {"sha256": sha256, "from": start, "count": _READ_BATCH}
            if self._conn is not None:
                try:
                    rows = self._conn.execute(Q["blob_chunks_read"], params).fetchall()
                except psycopg.Error as exc:
                    raise BlobUnreadable(self._session._why(exc)) from exc
            else:
                try:
                    with self._session._read() as conn:
                        rows = conn.execute(Q["blob_chunks_read"], params).fetchall()
                except StoreError as exc:
                    raise BlobUnreadable(str(exc)) from exc
            for row in rows:
                yield bytes(row[0])
            if len(rows) < _READ_BATCH:
                return
            start += len(rows)

    def read(self, ref: BlobRef) -> bytes:
        return b"".join(self.chunks(ref))

    def stored(self) -> list[tuple[str, int, float]]:
        with self._session._read() as conn:
            return [(str(r[0]), int(r[1]), float(r[2])) for r in conn.execute(Q["blob_list"])]

    def delete(self, sha256: str, older_than: float) -> bool:
        with self._transaction() as conn:
            gone = conn.execute(Q["blob_delete"], {"sha256": sha256, "before": older_than})
            if gone.fetchone() is None:
                return False
            conn.execute(Q["blob_chunks_drop"], {"key": sha256})
        return True

    def remove_orphans(self, task_id: str) -> None:
        """Nothing to remove: a killed writer's transaction rolled back."""

    def temps(self, older_than: float) -> list[tuple[str, int, float]]:
        """None: chunks under a temporary key never outlive their transaction."""
        return []

    def remove_temp(self, name: str, older_than: float) -> bool:
        """Nothing to remove (see :meth:`temps`)."""
        return False

    def remove_temps(self, older_than: float) -> list[str]:
        """Nothing to remove: chunks under a temporary key never outlive their transaction."""
        return []


def _rechunk(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The same bytes in pieces of at most :data:`CHUNK`."""
    for chunk in chunks:
        view = memoryview(chunk)
        while len(view) > CHUNK:
            yield bytes(view[:CHUNK])
            view = view[CHUNK:]
        if view:
            yield bytes(view)
