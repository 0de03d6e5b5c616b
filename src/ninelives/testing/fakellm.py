"""Scripted model servers on loopback that speak Ollama's and OpenAI's wire formats.

A :class:`FakeModelServer` answers ``POST /api/chat`` the way Ollama does and
``POST /v1/chat/completions`` the way an OpenAI-compatible server does, from a
script of turns given by the test, and records every request it receives. The
test suite proves each format faithful by driving the fake with the official
``ollama`` and ``openai`` clients before trusting it with ninelives' engines.

A turn is a :class:`Turn` (text and tool calls, rendered in the asked format)
or a fault: ``"hang"`` (never answers), ``"garbage"`` (200 with a body that
is not JSON), ``"http500"``, ``"die"`` (headers promise a body that breaks off),
``"wrong_shape"`` (JSON without the expected fields), ``bytes`` (a 200 with
exactly that body, in either format: a fuzzer's reply), and hostile ones:
``"echo_key"`` (401 whose body echoes the ``Authorization`` header about 100
characters in, as some gateways do), ``"echo_key_cut"`` (500 whose body puts
it across the 2048th byte, behind whitespace), ``"trickle"`` (the status line
and headers one byte a second, for up to ``hang_seconds``) and ``"huge"`` (a
200 reply of :data:`HUGE_BYTES` with no ``Content-Length``, the bytes it
sent counted in ``sent``).
``POST /api/generate`` (``summarize``'s Ollama path) answers ``{"response":
text}`` from the same script. When the script is used
up, the last turn repeats. With ``by_turn=True`` the script is indexed by the
number of assistant messages in the request instead of by arrival, so a
conversation asked again (after a kill) gets the same answer again, as a
deterministic model would give.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAULTS = (
    "hang", "garbage", "http500", "die", "wrong_shape", "echo_key", "echo_key_cut", "trickle",
    "huge",
)  # fmt: skip
#: The size of a ``"huge"`` reply: far over any client's cap.
HUGE_BYTES = 256 << 20


@dataclass(frozen=True)
class Turn:
    """One scripted answer: text, and tool calls as ``(name, arguments)`` pairs.

    Arguments given as a string are sent as they are: in the OpenAI format as the
    arguments' JSON text (``'{"n": NaN}'``, text that is not JSON at all), in
    Ollama's spliced into the reply body as its raw JSON."""

    text: str = ""
    calls: Sequence[tuple[str, dict[str, Any] | str]] = ()
    input_tokens: int = 11
    output_tokens: int = 7


@dataclass
class Request:
    """One request the fake received: its path, headers (lower-case names) and JSON body."""

    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeModelServer:
    """A loopback HTTP server answering from ``script``; see the module docstring."""

    script: list[Turn | str | bytes] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    hang_seconds: float = 30.0
    by_turn: bool = False
    #: Bytes of ``"huge"`` replies the client took before it hung up.
    sent: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._served = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._released = threading.Event()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``: Ollama's base URL; OpenAI's is this plus ``/v1``."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeModelServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._released.set()
        self._server.shutdown()
        self._server.server_close()

    def count(self, path_suffix: str = "") -> int:
        """How many requests arrived (whose path ends with ``path_suffix``)."""
        with self._lock:
            return sum(1 for r in self.requests if r.path.endswith(path_suffix))

    def _next(self, body: Any) -> Turn | str | bytes:
        with self._lock:
            if not self.script:
                return Turn(text="")
            index = self._served
            if self.by_turn:
                index = turn_of(body)
            self._served += 1
            return self.script[min(index, len(self.script) - 1)]

    def turns(self) -> list[int]:
        """The turn number (assistant messages so far) of each request, in order."""
        with self._lock:
            return [turn_of(r.body) for r in self.requests]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        """A handler class of its own, bound to this server."""
        server = self

        class Handler(ScriptedHandler):
            fake = server

        return Handler


def turn_of(body: Any) -> int:
    """How many assistant messages a request's conversation holds."""
    messages = body.get("messages") if isinstance(body, dict) else None
    return sum(1 for m in messages or () if isinstance(m, dict) and m.get("role") == "assistant")


#: Marks where raw arguments go in an Ollama reply body (see :func:`_raw_arguments`).
_RAW = "\x00raw-arguments\x00"


def _raw_arguments(body: str) -> str:
    """The reply body with each marked string replaced by the raw JSON it holds."""
    marker = json.dumps(_RAW)[:-1]  # the opening quote and the escaped marker
    while (start := body.find(marker)) >= 0:
        value, stop = json.JSONDecoder().raw_decode(body, start)
        body = body[:start] + value[len(_RAW) :] + body[stop:]
    return body


def _ollama_reply(turn: Turn, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": turn.text}
    if turn.calls:
        message["tool_calls"] = [
            {
                "function": {
                    "name": name,
                    "arguments": _RAW + args if isinstance(args, str) else args,
                }
            }
            for name, args in turn.calls
        ]
    return {
        "model": model,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()),
        "message": message,
        "done": True,
        "done_reason": "stop",
        "total_duration": 1_000_000,
        "load_duration": 1000,
        "prompt_eval_count": turn.input_tokens,
        "prompt_eval_duration": 1000,
        "eval_count": turn.output_tokens,
        "eval_duration": 1000,
    }


def _generate_reply(turn: Turn, model: str) -> dict[str, Any]:
    return {"model": model, "response": turn.text, "done": True}


def _openai_reply(turn: Turn, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": turn.text or None}
    if turn.calls:
        message["tool_calls"] = [
            {
                "id": f"call_{n}_{name}",
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
            for n, (name, args) in enumerate(turn.calls)
        ]
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if turn.calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": turn.input_tokens,
            "completion_tokens": turn.output_tokens,
            "total_tokens": turn.input_tokens + turn.output_tokens,
        },
    }


#: The reply body each path answers with, rendered from a :class:`Turn`.
RENDERERS = {
    "/api/chat": _ollama_reply,
    "/v1/chat/completions": _openai_reply,
    "/api/generate": _generate_reply,
}


class ScriptedHandler(BaseHTTPRequestHandler):
    """Answers each request with the next turn of :attr:`fake`'s script."""

    protocol_version = "HTTP/1.1"
    #: The server whose script and records this handler uses (set per server).
    fake: FakeModelServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self._record_request()
        render = RENDERERS.get(self.path)
        if render is None:
            self._send(404, b'{"error": "not found"}')
            return
        self._answer(self.fake._next(body), body, render)

    def _record_request(self) -> Any:
        """Read the request's JSON body (None when it is not JSON) and record it."""
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        with self.fake._lock:
            self.fake.requests.append(
                Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            )
        return body

    def _answer(
        self, turn: Turn | str | bytes, body: Any, render: Callable[[Turn, str], dict[str, Any]]
    ) -> None:
        """Send ``turn``: a reply rendered in the path's format, raw bytes, or a fault."""
        if isinstance(turn, bytes):
            self._send(200, turn)
        elif turn == "hang":
            self.fake._released.wait(self.fake.hang_seconds)
        elif turn == "garbage":
            self._send(200, b"<html>this is not JSON</html>")
        elif turn == "http500":
            self._send(500, b'{"error": "model crashed"}')
        elif turn == "wrong_shape":
            self._send(200, b'{"result": "no message here"}')
        elif turn in ("die", "echo_key", "echo_key_cut", "trickle", "huge"):
            getattr(self, f"_{turn}")()
        elif isinstance(turn, Turn):
            model = body.get("model", "") if isinstance(body, dict) else ""
            self._send(200, _raw_arguments(json.dumps(render(turn, model))).encode())
        else:  # pragma: no cover - a typo in a test's script
            raise ValueError(f"unknown scripted turn {turn!r}")

    def _die(self) -> None:
        """Headers that promise a body which breaks off, then a closed connection."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "4096")
        self.end_headers()
        self.wfile.write(b'{"message": {"role": "assist')
        self.wfile.flush()
        self.close_connection = True

    def _echo_key(self) -> None:
        said = self.headers.get("Authorization", "")
        lead = '{"error": {"type": "invalid_request_error", "message": "Incorrect '
        lead += "API key provided: "
        self._send(401, f'{lead}{said!r}; check it."}}}}'.encode())

    def _echo_key_cut(self) -> None:
        said = self.headers.get("Authorization", "").encode()
        lead = b"upstream said:"
        pad = b" " * (2048 - len(lead) - len(b"Bearer ") - 10)  # 10 bytes of the key fit
        self._send(500, lead + pad + said + b" was refused")

    def _trickle(self) -> None:
        started = time.monotonic()
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Pad: "
        try:
            for n in range(10_000):
                if time.monotonic() - started > self.fake.hang_seconds:
                    break
                self.wfile.write(head[n : n + 1] or b"a")
                self.wfile.flush()
                if self.fake._released.wait(1.0):
                    break
        except OSError:  # the client gave up: what this fault is for
            pass
        self.close_connection = True

    def _huge(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Connection", "close")  # no length: a reader must count
        self.end_headers()
        chunk = b" " * (1 << 20)
        try:
            for _ in range(HUGE_BYTES // len(chunk)):
                self.wfile.write(chunk)
                with self.fake._lock:
                    self.fake.sent += len(chunk)
        except OSError:  # the client hung up, as it should
            pass
        self.close_connection = True

    def _send(self, status: int, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@contextmanager
def fake_model_server(
    *script: Turn | str | bytes, hang_seconds: float = 30.0, by_turn: bool = False
) -> Iterator[FakeModelServer]:
    """Start a :class:`FakeModelServer` with ``script`` for the ``with`` block."""
    server = FakeModelServer(script=list(script), hang_seconds=hang_seconds, by_turn=by_turn)
    server.start()
    try:
        yield server
    finally:
        server.stop()
