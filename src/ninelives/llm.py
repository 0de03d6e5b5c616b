"""Model engines: one small interface, three implementations.

* ``stub``: deterministic and offline, for tests and the demo;
* ``ollama``: Ollama's ``POST <URL>/api/chat``, with tool calling;
* ``openai``: the OpenAI-compatible ``POST <URL>/chat/completions`` with
  ``tools``/``tool_calls``, which llama.cpp's server, vLLM, LM Studio and hosted
  APIs speak. ``<URL>`` is the base URL as the official clients take it, so it
  includes ``/v1``.

Conversations use one neutral message shape, the OpenAI one with decoded
arguments: ``{"role": "system"|"user"|"assistant"|"tool", "content": str}``,
an assistant message may carry ``"tool_calls": [{"id", "name", "arguments":
{...}}]``, and a tool message answers one call with ``"tool_call_id"`` and
``"name"``. Each engine converts it to its wire format.

Every failure of the exchange (a timeout, a refused connection, a reply that
dies mid-body, a reply that is not JSON or has the wrong shape, an HTTP error)
raises :class:`~ninelives.errors.ToolError` with one line naming the engine and
the URL, so a step records it as ``step_error``. The API key is sent only in
the ``Authorization`` header of a request to the configured URL: never through
a proxy, never along a redirect, and never in a message. Only the standard
library is used.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .errors import InputError, ToolError
from .exchange import HttpStatus, ReplyTooLarge, post, redact, snippet
from .names import ENGINES as ENGINES

DEFAULT_URLS = {"ollama": "http://127.0.0.1:11434", "openai": "http://127.0.0.1:8080/v1"}
DEFAULT_TIMEOUT = 120.0
#: A reply larger than this is refused rather than held in memory.
MAX_REPLY_BYTES = 16 << 20


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One call a model asked for: its id (made up when the wire has none), the
    tool's name and its decoded arguments."""

    id: str
    name: str
    arguments: dict[str, Any]
    #: Why the arguments cannot be used as they came (not decodable: nested too
    #: deep), or ''; the agent makes it the call's error result.
    problem: str = ""

    def as_message(self) -> dict[str, Any]:
        """The call in the neutral message shape."""
        return {"id": self.id, "name": self.name, "arguments": self.arguments}


@dataclass(frozen=True, kw_only=True)
class Reply:
    """A model's answer to one request, with what it cost."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    engine: str
    model: str
    input_tokens: int
    output_tokens: int
    ms: float

    def usage(self) -> dict[str, int]:
        """Token counts as steps store them."""
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Which engine, where, and how long to wait. Build with :meth:`from_env`."""

    engine: str = "stub"
    url: str = ""
    model: str = ""
    api_key: str = field(default="", repr=False)
    timeout: float = DEFAULT_TIMEOUT
    allow_remote: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: str) -> EngineConfig:
        """``NINELIVES_LLM`` (``stub|ollama|openai``), ``NINELIVES_LLM_URL``,
        ``NINELIVES_LLM_MODEL``, ``NINELIVES_LLM_API_KEY``, ``NINELIVES_LLM_TIMEOUT``
        (seconds) and ``NINELIVES_LLM_ALLOW_REMOTE=1``; ``overrides`` (``engine``,
        ``model``: a plan's choice) win. For ``ollama`` the contract's
        ``OLLAMA_URL`` and ``OLLAMA_MODEL`` are the fallbacks. A bad value is an
        :class:`~ninelives.errors.InputError`."""
        env = os.environ if env is None else env
        engine = overrides.get("engine") or env.get("NINELIVES_LLM") or "stub"
        if engine not in ENGINES:
            raise InputError(f"unknown model engine {engine!r} (known: {', '.join(ENGINES)})")
        url = env.get("NINELIVES_LLM_URL") or ""
        model = overrides.get("model") or env.get("NINELIVES_LLM_MODEL") or ""
        if engine == "ollama":
            url = url or env.get("OLLAMA_URL") or DEFAULT_URLS["ollama"]
            model = model or env.get("OLLAMA_MODEL") or "llama3.2"
        elif engine == "openai":
            url = url or DEFAULT_URLS["openai"]
        raw_timeout = env.get("NINELIVES_LLM_TIMEOUT") or ""
        try:
            timeout = float(raw_timeout) if raw_timeout else DEFAULT_TIMEOUT
        except ValueError:
            raise InputError(
                f"NINELIVES_LLM_TIMEOUT must be seconds, got {raw_timeout!r}"
            ) from None
        if not 0.1 <= timeout <= 86400:  # also refuses NaN
            raise InputError(
                f"NINELIVES_LLM_TIMEOUT must be 0.1-86400 seconds, got {raw_timeout!r}"
            )
        config = cls(
            engine=engine,
            url=url.rstrip("/"),
            model=model,
            api_key=env.get("NINELIVES_LLM_API_KEY") or "",
            timeout=timeout,
            allow_remote=env.get("NINELIVES_LLM_ALLOW_REMOTE", "") not in ("", "0"),
        )
        config.check()
        return config

    def check(self) -> None:
        """Refuse a configuration that cannot work, before any request:
        a URL that is not http(s), one off this machine without
        ``NINELIVES_LLM_ALLOW_REMOTE=1``, an ``openai`` engine without a model."""
        if self.engine == "stub":
            return
        from urllib.parse import urlsplit

        parts = urlsplit(self.url)
        shown = public_url(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InputError(
                f"{self.engine}: NINELIVES_LLM_URL must be an http(s) URL, got {shown!r}"
            )
        self._check_url_form(parts)
        if parts.username is not None or parts.password is not None:
            raise InputError(
                f"{self.engine}: NINELIVES_LLM_URL must not hold credentials "
                "(put the key in NINELIVES_LLM_API_KEY)"
            )
        if not all("!" <= c <= "~" for c in self.api_key):
            # Sent as a header, which http.client refuses, naming the key, at every attempt.
            raise InputError(
                f"{self.engine}: NINELIVES_LLM_API_KEY must be printable ASCII without spaces: it "
                "holds a space, a line break (a key read from a file may end with one) or a "
                "character beyond ASCII (the key is not shown)"
            )
        if not self.allow_remote and not is_loopback(parts.hostname):
            raise InputError(
                f"{self.engine}: {shown} is not on this machine; set NINELIVES_LLM_ALLOW_REMOTE=1 "
                "to send prompts (and the API key) there"
            )
        if not self.model:
            raise InputError(f"{self.engine}: set NINELIVES_LLM_MODEL (or 'model' in the plan)")
        try:
            self.model.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8, as os.environ keeps them
            raise InputError(
                f"{self.engine}: NINELIVES_LLM_MODEL (or the plan's 'model') is not valid "
                f"UTF-8 text: {self.model!r}"
            ) from None

    def _check_url_form(self, parts: Any) -> None:
        """Refuse a base URL no request can use as it is: a port that is not one,
        whitespace or a control character, a query or fragment (the engine's path
        is appended to the URL, after them). Each failed every attempt."""
        shown = public_url(self.url)
        try:
            parts.port  # noqa: B018 - a property that raises on a bad port
        except ValueError:
            raise InputError(
                f"{self.engine}: NINELIVES_LLM_URL has no valid port (1-65535): {shown!r}"
            ) from None
        if any(c.isspace() or not c.isprintable() for c in self.url):
            raise InputError(
                f"{self.engine}: NINELIVES_LLM_URL must hold no space, line break or control "
                f"character: {shown!r}"
            )
        if parts.query or parts.fragment or "?" in self.url or "#" in self.url:
            raise InputError(
                f"{self.engine}: NINELIVES_LLM_URL must hold no query or fragment ('?', '#'): "
                "the engine appends its path (/chat/completions, /api/chat) to it"
            )


def check_engine(
    task_id: str, idx: int, fields: Mapping[str, Any], error: type[InputError] = InputError
) -> None:
    """Raise ``error`` (exit 4) if step ``idx`` would ask a model engine that is
    misconfigured here (``NINELIVES_LLM*``, with ``fields``' ``engine`` and
    ``model``): checked before the step starts, as a missing tool is. Read when
    the step runs, a typo in a variable was a ``step_error`` at every attempt and
    failed the task. Plan model steps and ``ctx.chat`` both ask it."""
    overrides = {k: v for k in ("engine", "model") if isinstance(v := fields.get(k), str) and v}
    try:
        EngineConfig.from_env(None, **overrides)
    except InputError as exc:
        raise error(
            f"task {task_id!r} step {idx} cannot ask its model here: {exc}; it was not "
            "started (nothing written): fix the NINELIVES_LLM* variables, then run again"
        ) from None


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    import ipaddress

    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def public_url(url: str) -> str:
    """``url`` without user info, query or fragment: safe to print."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        if parts.port is not None:
            netloc += f":{parts.port}"
    except ValueError:
        return "<unparsable URL>"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class Engine(Protocol):
    """What a step needs from a model: one request, one :class:`Reply`."""

    name: str
    model: str

    def chat(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] = ()
    ) -> Reply:
        """Send the conversation (neutral shape) and the tool definitions
        (``{"name", "description", "parameters": JSON Schema}``); raise
        :class:`~ninelives.errors.ToolError` if no usable reply comes back."""
        ...


def open_engine(config: EngineConfig) -> Engine:
    """The engine ``config`` names."""
    if config.engine == "ollama":
        return OllamaEngine(config)
    if config.engine == "openai":
        return OpenAIEngine(config)
    return StubEngine(config.model or "stub")


# -- stub ---------------------------------------------------------------------


def stub_lines(text: str) -> str:
    """The stub's answer: the first three non-empty lines, stripped, joined by newlines."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return "\n".join(lines[:3])


class StubEngine:
    """Deterministic and offline, and counts words as tokens. It answers with the
    first three non-empty lines of the last user message. Offered the
    ``write_artifact`` tool before it has answered anything, it first calls it
    once, publishing that answer as ``report.md``: enough to run an agent's
    whole loop (a call, its result, the answer) without a model."""

    name = "stub"

    def __init__(self, model: str = "stub") -> None:
        self.model = model

    def chat(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] = ()
    ) -> Reply:
        started = time.perf_counter()
        last = next((m for m in reversed(messages) if m.get("role") == "user"), {"content": ""})
        text = stub_lines(str(last.get("content") or ""))
        words = sum(len(str(m.get("content") or "").split()) for m in messages)
        calls: tuple[ToolCall, ...] = ()
        answered = any(m.get("role") == "assistant" for m in messages)
        if not answered and any(t.get("name") == "write_artifact" for t in tools):
            arguments = {"name": "report.md", "text": text}
            calls = (ToolCall(id="call_0", name="write_artifact", arguments=arguments),)
            text = ""
        return Reply(
            text=text,
            tool_calls=calls,
            engine=self.name,
            model=self.model,
            input_tokens=words,
            output_tokens=len(text.split()),
            ms=round((time.perf_counter() - started) * 1000, 3),
        )


# -- HTTP engines -------------------------------------------------------------


def fail(name: str, url: str, what: str, secret: str = "") -> ToolError:
    """The one-line :class:`~ninelives.errors.ToolError` of a failed exchange with
    the ``name`` engine at ``url``, ``secret`` (the API key) redacted."""
    text = redact(f"{name} at {public_url(url)}: {what}", secret)
    return ToolError(" ".join(text.split()))


def post_json(name: str, url: str, body: Any, headers: Mapping[str, str], *, timeout: float,
              secret: str = "") -> Any:  # fmt: skip
    """POST ``body`` as JSON to ``url`` and decode the JSON reply: within ``timeout``
    seconds for the whole exchange, at most :data:`MAX_REPLY_BYTES`, straight to
    the URL (:func:`ninelives.exchange.post`). Every failure is :func:`fail`'s
    one line naming ``name`` and the URL, ``secret`` redacted before any cut."""
    import http.client

    try:
        data = json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError, UnicodeEncodeError) as exc:
        raise fail(name, url, f"request cannot be encoded as JSON: {exc}", secret) from None
    try:
        raw = post(url, data, headers, timeout=timeout, limit=MAX_REPLY_BYTES)
    except HttpStatus as exc:
        detail = f": {snippet(exc.body, secret, cut=exc.cut)}" if exc.body else ""
        raise fail(name, url, f"HTTP {exc.status} {exc.reason}{detail}", secret) from None
    except TimeoutError:
        what = f"no reply within {timeout:g} s (NINELIVES_LLM_TIMEOUT)"
        raise fail(name, url, what, secret) from None
    except ReplyTooLarge as exc:
        raise fail(name, url, str(exc), secret) from None
    except (http.client.HTTPException, ConnectionResetError, BrokenPipeError) as exc:
        what = f"the reply broke off: {type(exc).__name__}: {exc}"
        raise fail(name, url, what, secret) from None
    except OSError as exc:  # refused, unreachable, no such host
        raise fail(name, url, f"cannot connect: {exc.strerror or exc}", secret) from None
    except ValueError as exc:  # not http(s), a header with a line break
        raise fail(name, url, f"the request cannot be sent: {exc}", secret) from None
    try:
        return json.loads(raw)
    except RecursionError:
        raise fail(name, url, "the reply is nested too deeply to decode", secret) from None
    except (ValueError, UnicodeDecodeError):
        raise fail(name, url, f"the reply is not JSON: {snippet(raw, secret)}", secret) from None


class _HttpEngine:
    name = ""
    path = ""

    def __init__(self, config: EngineConfig) -> None:
        config.check()
        self.config = config
        self.model = config.model
        self.endpoint = config.url + self.path

    def _fail(self, what: str) -> ToolError:
        return fail(self.name, self.endpoint, what, self.config.api_key)

    def _snip(self, value: Any) -> str:
        return snippet(value, self.config.api_key)

    def _post(self, body: Mapping[str, Any]) -> tuple[Any, float]:
        """POST ``body`` as JSON; the decoded reply and the milliseconds it took."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        started = time.perf_counter()
        reply = post_json(self.name, self.endpoint, body, headers,
                          timeout=self.config.timeout, secret=self.config.api_key)  # fmt: skip
        return reply, round((time.perf_counter() - started) * 1000, 3)

    def _calls(self, raw: Any) -> tuple[ToolCall, ...]:
        """The tool calls of a reply's message, in both wire formats: OpenAI sends
        arguments as a JSON string and an id, Ollama an object and no id."""
        calls = []
        for n, call in enumerate(raw if isinstance(raw, list) else ()):
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise self._fail(f"tool call {n} has no function name")
            arguments = function.get("arguments") or {}
            problem = ""
            if isinstance(arguments, str):
                arguments, problem = _decode_arguments(arguments)
            # Numbered when the wire has no id: stable for this reply, which is
            # committed with the turn, so the next turn answers the same ids.
            call_id = call.get("id") if isinstance(call.get("id"), str) else f"call_{n}"
            calls.append(_call(whole(call_id), whole(function["name"]), arguments, problem))
        return tuple(calls)

    @staticmethod
    def _count(value: Any) -> int:
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class OllamaEngine(_HttpEngine):
    """Ollama's ``/api/chat`` (non-streaming), with tool calling."""

    name = "ollama"
    path = "/api/chat"

    def chat(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] = ()
    ) -> Reply:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [_to_ollama(m) for m in messages],
            "stream": False,
        }
        if tools:
            body["tools"] = [_tool_definition(t) for t in tools]
        reply, ms = self._post(body)
        message = reply.get("message") if isinstance(reply, dict) else None
        if not isinstance(message, dict):
            raise self._fail(f"the reply has no 'message' object: {self._snip(reply)}")
        text = message.get("content") or ""
        if not isinstance(text, str):
            raise self._fail("the reply's message content is not text")
        return Reply(
            text=whole(text),
            tool_calls=self._calls(message.get("tool_calls")),
            engine=self.name,
            model=whole(str(reply.get("model") or self.model)),
            input_tokens=self._count(reply.get("prompt_eval_count")),
            output_tokens=self._count(reply.get("eval_count")),
            ms=ms,
        )


class OpenAIEngine(_HttpEngine):
    """The OpenAI-compatible ``/chat/completions`` endpoint, with tool calling."""

    name = "openai"
    path = "/chat/completions"

    def chat(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] = ()
    ) -> Reply:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [_to_openai(m) for m in messages],
        }
        if tools:
            body["tools"] = [_tool_definition(t) for t in tools]
        reply, ms = self._post(body)
        choices = reply.get("choices") if isinstance(reply, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise self._fail(f"the reply has no 'choices': {self._snip(reply)}")
        message = choices[0].get("message")
        if not isinstance(message, dict):
            raise self._fail("the reply's first choice has no 'message' object")
        text = message.get("content") or ""
        if not isinstance(text, str):
            raise self._fail("the reply's message content is not text")
        usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else {}
        return Reply(
            text=whole(text),
            tool_calls=self._calls(message.get("tool_calls")),
            engine=self.name,
            model=whole(str(reply.get("model") or self.model)),
            input_tokens=self._count(usage.get("prompt_tokens")),
            output_tokens=self._count(usage.get("completion_tokens")),
            ms=ms,
        )


# -- wire formats -------------------------------------------------------------


def _tool_definition(tool: Mapping[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {
        "name": tool["name"],
        "parameters": tool.get("parameters") or {"type": "object", "properties": {}},
    }
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _to_openai(message: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message["role"], "content": message.get("content") or ""}
    if message.get("tool_calls"):
        out["content"] = message.get("content") or None
        out["tool_calls"] = [
            {
                "id": call["id"],
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": json.dumps(call["arguments"], ensure_ascii=False),
                },
            }
            for call in message["tool_calls"]
        ]
    if message["role"] == "tool":
        out["tool_call_id"] = message["tool_call_id"]
    return out


def _to_ollama(message: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message["role"], "content": message.get("content") or ""}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {"function": {"name": call["name"], "arguments": call["arguments"]}}
            for call in message["tool_calls"]
        ]
    if message["role"] == "tool" and message.get("name"):
        out["tool_name"] = message["name"]
    return out


def whole(text: str) -> str:
    """``text`` with each lone surrogate a reply escaped (``"\\ud83d"``: half an
    emoji) replaced by U+FFFD: no store can hold one, and a turn whose output
    cannot be stored is asked again, paid again, at every attempt. Arguments
    keep theirs: such arguments are that call's error, which the model reads."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def _decode_arguments(raw: str) -> tuple[Any, str]:
    """Arguments sent as JSON text, decoded, and why they cannot be used ('' if they can)."""
    try:
        return (json.loads(raw) if raw.strip() else {}), ""
    except ValueError:
        # Not a reason to fail the exchange: a call error the model is told of,
        # and the tool does not run on arguments nobody gave it.
        return {"_unparsed_arguments": raw}, "the arguments are not valid JSON"
    except RecursionError:
        # Too deep for the decoder: a call error, not a failed exchange.
        return {}, "the arguments are nested too deeply to decode"


def _call(call_id: str, name: str, arguments: Any, problem: str = "") -> ToolCall:
    if not isinstance(arguments, dict):
        arguments = {"_arguments": arguments}
        problem = problem or "the arguments are not a JSON object"
    return ToolCall(id=call_id, name=name, arguments=arguments, problem=problem)
