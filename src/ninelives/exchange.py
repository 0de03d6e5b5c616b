"""One bounded HTTP exchange: the POST of every model client (the engines of
:mod:`ninelives.llm` and ``summarize``'s Ollama path).

* **One deadline for the whole exchange.** Connecting, sending, the status
  line, the headers and the body all end at ``timeout`` seconds from the start.
  A socket timeout alone bounds each read, so a server trickling one byte a
  second would hold a reader forever; here a timer shuts the socket down at
  the deadline, which ends whatever read is waiting, and the exchange raises
  :class:`TimeoutError`.
* **A size cap.** A reply over ``limit`` bytes is refused (at once when its
  ``Content-Length`` says so), never held in memory whole.
* **Straight to the URL.** No proxy from the environment and no redirect is
  followed (a 3xx is an :class:`HttpStatus` like any error status): the
  prompt and the API key go to the configured URL and nowhere else.
* **Redaction before any cut.** :func:`redact` removes a secret from text
  before it is shortened, including the start of one cut off at the end.

Only the standard library is used.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

#: Bytes of an error status's body kept for its message.
ERROR_BODY_BYTES = 2048
#: What a secret becomes in a message.
REDACTED = "***"


class HttpStatus(Exception):
    """The server answered with a status that is not 2xx; ``body`` is the start
    of its body (``cut``: there may be more)."""

    def __init__(self, status: int, reason: str, body: bytes) -> None:
        super().__init__(f"HTTP {status} {reason}")
        self.status, self.reason, self.body = status, reason, body
        self.cut = len(body) >= ERROR_BODY_BYTES


class ReplyTooLarge(OSError):
    """The reply is larger than the exchange's ``limit``."""


def redact(text: str, secret: str, *, cut: bool = False) -> str:
    """``text`` with every occurrence of ``secret`` replaced by ``***``; when
    ``cut`` (the text is the start of a longer one), a tail that is the start
    of ``secret`` too. Run it on text before it is shortened, never after."""
    if not secret:
        return text
    text = text.replace(secret, REDACTED)
    if not cut:
        return text
    for size in range(min(len(secret) - 1, len(text)), 0, -1):
        if text.endswith(secret[:size]):
            return text[:-size] + REDACTED
    return text


def snippet(value: Any, secret: str = "", limit: int = 120, *, cut: bool = False) -> str:
    """``value`` (bytes, or anything by its ``repr``) on one line for a message,
    ``secret`` redacted (:func:`redact`; ``cut``: ``value`` is the start of a
    longer body), then cut to ``limit`` characters."""
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else repr(value)
    text = " ".join(redact(text, secret, cut=cut).split())
    return text[:limit] + ("…" if len(text) > limit else "")


class _Deadline:
    """Shuts the watched socket down once ``seconds`` have passed."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds
        self.expired = False
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def left(self) -> float:
        return max(self.at - time.monotonic(), 0.001)

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
            if self.expired:
                _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            if self._sock is not None:
                _shut(self._sock)

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        with self._lock:
            self._sock = None


def _shut(sock: socket.socket) -> None:
    # socket.socket's own shutdown, also for an SSL socket: it ends a read
    # blocked in another thread without touching the TLS state that read uses.
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:  # already closed, or never connected
        pass


def post(url: str, data: bytes, headers: Mapping[str, str], *, timeout: float,
         limit: int) -> bytes:  # fmt: skip
    """POST ``data`` to ``url`` and return the reply's body.

    Raises :class:`TimeoutError` when the whole exchange is not over within
    ``timeout`` seconds, :class:`HttpStatus` for a status that is not 2xx,
    :class:`ReplyTooLarge` for a body over ``limit`` bytes,
    :class:`OSError` or :class:`http.client.HTTPException` when the connection
    fails or the reply breaks off, and :class:`ValueError` for a URL that is not
    http(s) or a header that cannot be sent."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http(s) URL")
    https = parts.scheme == "https"
    port = parts.port or (443 if https else 80)
    host = parts.hostname or ""
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    with _Deadline(timeout) as deadline:
        conn = (http.client.HTTPSConnection if https else http.client.HTTPConnection)(
            host, port, timeout=timeout
        )
        try:
            sock = socket.create_connection((host, port), timeout=deadline.left())
            deadline.watch(sock)
            if https:
                import ssl

                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
                deadline.watch(sock)
            conn.sock = sock
            conn.request("POST", path, body=data, headers=dict(headers))
            with conn.getresponse() as response:
                if not 200 <= response.status < 300:
                    body = response.read(ERROR_BODY_BYTES)
                    raise HttpStatus(response.status, response.reason, body)
                raw = _read_until(response, deadline, limit)
        except (OSError, http.client.HTTPException):
            if deadline.expired:
                raise TimeoutError from None
            raise
        finally:
            conn.close()
        if deadline.expired:  # a body read to its end may have been cut by the shutdown
            raise TimeoutError
    return raw


def _read_until(response: Any, deadline: _Deadline, limit: int) -> bytes:
    """The whole body, refusing one that grows past ``limit`` (or says it will)."""
    import http.client

    promised = response.length
    if promised is not None and promised > limit:
        raise ReplyTooLarge(f"the reply is larger than {limit} bytes ({promised} announced)")
    chunks: list[bytes] = []
    size = 0
    while True:
        if deadline.expired:
            raise TimeoutError
        chunk = response.read1(1 << 16)
        if not chunk:
            missing = response.length
            if missing:  # the server promised more bytes than it sent
                raise http.client.IncompleteRead(b"".join(chunks), missing)
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise ReplyTooLarge(f"the reply is larger than {limit} bytes")
        chunks.append(chunk)
