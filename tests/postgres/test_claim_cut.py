"""A connection cut at a claim's COMMIT, through a real TCP proxy on loopback.

A worker polls with ``claim_next``. When the queue is empty the claim writes
nothing, so a connection lost at its COMMIT is a plain store error (the worker
waits and polls again). When the claim took a task, the outcome is truly unknown
and the process must stop (``CommitUnknown``). Before the fix the empty poll was
an unknown outcome too: a database going down under an idle worker stopped it,
now and then, instead of letting it wait (seen as a flaky worker test).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from ninelives.errors import CommitUnknown, StoreError
from ninelives.plan import plan_from_dict
from ninelives.store import open_store

pytestmark = pytest.mark.postgres


class CutAtCommit:
    """Forwards one client's bytes to the server and back; once armed, closes both
    sides as soon as the client sends a COMMIT (which the server never sees)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.armed = threading.Event()
        self.cut = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        try:
            while data := src.recv(65536):
                if upstream and self.armed.is_set() and b"COMMIT" in data:
                    self.cut.set()
                    break
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def proxied(pg_database: str) -> Iterator[tuple[str, CutAtCommit]]:
    parts = urlsplit(pg_database)
    proxy = CutAtCommit(parts.hostname or "127.0.0.1", parts.port or 5432)
    user = f"{parts.username}@" if parts.username else ""
    netloc = f"{user}127.0.0.1:{proxy.port}"
    query = "&".join(q for q in (parts.query, "sslmode=disable") if q)
    try:
        yield urlunsplit((parts.scheme, netloc, parts.path, query, "")), proxy
    finally:
        proxy.close()


PLAN = plan_from_dict({"goal": "g", "steps": [{"tool": "fetch", "input": {"path": "a"}}]})


def test_an_empty_claim_cut_at_its_commit_is_a_plain_store_error(
    proxied: tuple[str, CutAtCommit],
) -> None:
    url, proxy = proxied
    store = open_store(url)
    try:
        proxy.armed.set()
        with pytest.raises(StoreError) as caught:
            store.claim_next("default", "run-1")
        assert proxy.cut.is_set()
        assert not isinstance(caught.value, CommitUnknown), caught.value
    finally:
        store.close()


def test_a_claim_that_took_a_task_cut_at_its_commit_is_an_unknown_outcome(
    proxied: tuple[str, CutAtCommit],
) -> None:
    url, proxy = proxied
    store = open_store(url)
    try:
        store.create_task("t1", PLAN, queue="default")
        proxy.armed.set()
        with pytest.raises(CommitUnknown):
            store.claim_next("default", "run-1")
        assert proxy.cut.is_set()
    finally:
        store.close()
