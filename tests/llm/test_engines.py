"""Model engines against loopback servers that speak Ollama's and OpenAI's wire formats.

The fakes are proven faithful first, by the official ``ollama`` and ``openai``
clients; then ninelives' own engines are driven against them, including every
way an exchange can fail.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from errorlines import one_line
from ninelives.errors import InputError, ToolError
from ninelives.llm import EngineConfig, open_engine
from ninelives.testing import Lab
from ninelives.testing.fakellm import FakeModelServer, Turn, fake_model_server

WEATHER = {
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "the city"}},
        "required": ["city"],
    },
}
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
]
CALL = Turn(text="", calls=[("get_weather", {"city": "Paris"})], input_tokens=21, output_tokens=5)
SECRET = "sk-planted-secret-0123456789"


def config(engine: str, url: str, **extra: str) -> EngineConfig:
    env = {"NINELIVES_LLM": engine, "NINELIVES_LLM_URL": url, "NINELIVES_LLM_MODEL": "m1"}
    env.update(extra)
    return EngineConfig.from_env(env)


def base_url(engine: str, server: FakeModelServer) -> str:
    return server.url + "/v1" if engine == "openai" else server.url


@pytest.fixture
def server() -> Iterator[FakeModelServer]:
    with fake_model_server(CALL, Turn(text="Sunny, 21 C.")) as fake:
        yield fake


# -- the fakes are faithful ---------------------------------------------------


def _ollama_exchange(client: Any) -> tuple[Any, Any]:
    first = client.chat(
        model="m1", messages=CONVERSATION, tools=[{"type": "function", "function": WEATHER}]
    )
    call = first.message.tool_calls[0]
    second = client.chat(
        model="m1",
        messages=[
            *CONVERSATION,
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
        ],
    )
    return first, second


def test_official_ollama_client_reads_the_fake(server: FakeModelServer) -> None:
    import ollama

    with ollama.Client(host=server.url) as client:
        first, second = _ollama_exchange(client)
    assert first.message.tool_calls is not None
    call = first.message.tool_calls[0]
    assert (call.function.name, dict(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert (first.prompt_eval_count, first.eval_count) == (21, 5)
    assert second.message.content == "Sunny, 21 C."
    assert server.count("/api/chat") == 2


@pytest.mark.slow
def test_official_openai_client_reads_the_fake(server: FakeModelServer) -> None:
    import openai

    with openai.OpenAI(base_url=server.url + "/v1", api_key=SECRET, max_retries=0) as client:
        first = client.chat.completions.create(
            model="m1", messages=CONVERSATION, tools=[{"type": "function", "function": WEATHER}]
        )
        choice = first.choices[0]
        call = choice.message.tool_calls[0]
        second = client.chat.completions.create(
            model="m1",
            messages=[
                *CONVERSATION,
                choice.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
            ],
        )
    assert choice.finish_reason == "tool_calls"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert first.usage is not None
    assert first.usage.prompt_tokens == 21
    assert second.choices[0].message.content == "Sunny, 21 C."
    assert server.requests[0].headers["authorization"] == f"Bearer {SECRET}"


@pytest.mark.parametrize("engine", ["ollama", "openai"])
def test_engine_sends_what_the_official_client_sends(engine: str) -> None:
    """The request bodies of ninelives' engine and of the official client agree
    on every field both send."""
    tools = [{"type": "function", "function": WEATHER}]
    with fake_model_server(CALL) as fake:
        if engine == "ollama":
            import ollama

            with ollama.Client(host=fake.url) as oc:
                oc.chat(model="m1", messages=CONVERSATION, tools=tools)
        else:
            import openai

            with openai.OpenAI(base_url=fake.url + "/v1", api_key="k", max_retries=0) as client:
                client.chat.completions.create(model="m1", messages=CONVERSATION, tools=tools)
        open_engine(config(engine, base_url(engine, fake))).chat(CONVERSATION, [WEATHER])
        official, ours = (r.body for r in fake.requests)
    for key in ("model", "messages", "tools"):
        assert ours[key] == official[key], key
    if engine == "ollama":
        assert ours["stream"] is False


# -- ninelives' engines -------------------------------------------------------


@pytest.mark.parametrize("engine", ["ollama", "openai"])
def test_engine_round_trip_with_tool_calls(engine: str, server: FakeModelServer) -> None:
    model = open_engine(config(engine, base_url(engine, server)))
    first = model.chat(CONVERSATION, [WEATHER])
    assert [(c.name, c.arguments) for c in first.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert (first.engine, first.model, first.input_tokens, first.output_tokens) == (
        engine,
        "m1",
        21,
        5,
    )
    assert first.ms >= 0
    history = [
        *CONVERSATION,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [c.as_message() for c in first.tool_calls],
        },
        {
            "role": "tool",
            "tool_call_id": first.tool_calls[0].id,
            "name": "get_weather",
            "content": "sunny",
        },
    ]
    second = model.chat(history, [WEATHER])
    assert second.text == "Sunny, 21 C."
    assert second.tool_calls == ()
    sent = server.requests[1].body["messages"]
    if engine == "openai":
        assert sent[2]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
        assert sent[3]["tool_call_id"] == first.tool_calls[0].id
    else:
        assert sent[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
        assert sent[3]["tool_name"] == "get_weather"


def test_stub_engine_is_deterministic_and_offline() -> None:
    stub = open_engine(EngineConfig.from_env({}))
    reply = stub.chat([{"role": "user", "content": "a\n\n b \nc\nd"}])
    assert (reply.text, reply.engine, reply.tool_calls) == ("a\nb\nc", "stub", ())
    assert reply == stub.chat([{"role": "user", "content": "a\n\n b \nc\nd"}]).__class__(
        **{**reply.__dict__, "ms": reply.ms}
    )


FAULT_MESSAGES = {
    "hang": "no reply within",
    "garbage": "not JSON",
    "http500": "HTTP 500",
    "die": "broke off",
    "wrong_shape": "has no",
}


@pytest.mark.parametrize("engine", ["ollama", "openai"])
@pytest.mark.parametrize("fault", sorted(FAULT_MESSAGES))
def test_every_failed_exchange_is_one_line_naming_engine_and_url(engine: str, fault: str) -> None:
    with fake_model_server(fault, hang_seconds=5) as fake:
        cfg = config(
            engine,
            base_url(engine, fake),
            NINELIVES_LLM_TIMEOUT="0.5",
            NINELIVES_LLM_API_KEY=SECRET,
        )
        with pytest.raises(ToolError) as caught:
            open_engine(cfg).chat(CONVERSATION)
        assert fake.count() == 1
    message = str(caught.value)
    assert FAULT_MESSAGES[fault] in message
    assert message.startswith(f"{engine} at http://127.0.0.1:")
    assert "\n" not in message
    assert SECRET not in message


@pytest.mark.parametrize("engine", ["ollama", "openai"])
def test_refused_connection_is_a_tool_error(engine: str) -> None:
    from pgcluster import free_port  # a port nothing listens on

    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ToolError, match=rf"^{engine} at {url}.*cannot connect"):
        open_engine(config(engine, url)).chat(CONVERSATION)


def test_redirects_are_not_followed() -> None:
    """A redirect could carry the prompt and the key elsewhere: it is an error."""
    with fake_model_server(Turn(text="elsewhere")) as other:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Redirect(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.send_response(307)
                self.send_header("Location", other.url + "/v1/chat/completions")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
            cfg = config("openai", url, NINELIVES_LLM_API_KEY=SECRET)
            with pytest.raises(ToolError, match="HTTP 307"):
                open_engine(cfg).chat(CONVERSATION)
        finally:
            httpd.shutdown()
            httpd.server_close()
        assert other.count() == 0


def test_proxy_settings_are_ignored(
    monkeypatch: pytest.MonkeyPatch, server: FakeModelServer
) -> None:
    """A proxy from the environment would see the key: requests go straight to the URL."""
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    reply = open_engine(config("ollama", server.url)).chat(CONVERSATION)
    assert reply.tool_calls
    assert server.count() == 1


@pytest.mark.parametrize(
    "url",
    ["http://10.0.0.5:11434", "http://example.com/v1", "http://[2001:db8::1]:8080/v1"],
)
def test_remote_urls_need_an_explicit_allow(url: str) -> None:
    with pytest.raises(InputError, match="NINELIVES_LLM_ALLOW_REMOTE=1"):
        config("openai", url)
    assert config("openai", url, NINELIVES_LLM_ALLOW_REMOTE="1").url == url


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:1/v1", "http://localhost:8080/v1", "http://[::1]:80"]
)
def test_loopback_urls_are_allowed(url: str) -> None:
    assert config("openai", url).url == url


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"NINELIVES_LLM": "gpt"}, "unknown model engine"),
        ({"NINELIVES_LLM": "openai", "NINELIVES_LLM_TIMEOUT": "nan"}, "NINELIVES_LLM_TIMEOUT"),
        ({"NINELIVES_LLM": "openai", "NINELIVES_LLM_TIMEOUT": "soon"}, "NINELIVES_LLM_TIMEOUT"),
        ({"NINELIVES_LLM": "openai"}, "NINELIVES_LLM_MODEL"),
        ({"NINELIVES_LLM": "ollama", "NINELIVES_LLM_URL": "file:///etc/passwd"}, "http"),
        # Bytes that are not UTF-8 (os.environ keeps them as lone surrogates): the
        # request could not be encoded, a step_error at every attempt.
        ({"NINELIVES_LLM": "openai", "NINELIVES_LLM_MODEL": "m\udcff"}, "NINELIVES_LLM_MODEL"),
        ({"NINELIVES_LLM": "ollama", "OLLAMA_MODEL": "llama\udcff"}, "NINELIVES_LLM_MODEL"),
    ],
)
def test_bad_settings_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(InputError, match=message):
        EngineConfig.from_env(env)


def test_credentials_in_the_url_are_refused_without_echoing_them() -> None:
    url = f"http://user:{SECRET}@127.0.0.1:8080/v1"
    with pytest.raises(InputError, match="NINELIVES_LLM_API_KEY") as caught:
        config("openai", url)
    assert SECRET not in str(caught.value)


def test_the_key_is_not_in_the_config_repr() -> None:
    cfg = config("openai", "http://127.0.0.1:1/v1", NINELIVES_LLM_API_KEY=SECRET)
    assert SECRET not in repr(cfg)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:99999/v1", "port"),
        ("http://127.0.0.1:8o80/v1", "port"),
        ("http://127.0.0.1:8080/v 1", "space"),
        ("http://127.0.0.1:8080/v1\r", "space"),
        ("http://127.0.0.1:8080/v1?api-version=1", "query"),
        ("http://127.0.0.1:8080/v1#top", "query"),
    ],
)
def test_a_url_no_request_can_use_is_refused(lab: Lab, url: str, why: str) -> None:
    """Refused when the engine is configured (exit 4 before a plan's model step
    starts, nothing written), as a URL that is not http(s) is: each was a
    step_error at every attempt, and a query or fragment sent the request to
    another path than the one the error named."""
    with pytest.raises(InputError, match="NINELIVES_LLM_URL") as caught:
        config("openai", url)
    assert why in str(caught.value)
    lab.write_plan({"steps": [{"tool": "llm", "input": {"prompt": "Hello?"}}]})
    assert lab.cli("create", "t", "plan.json").returncode == 0
    before = lab.snapshot("t")
    env = {"NINELIVES_LLM": "openai", "NINELIVES_LLM_URL": url, "NINELIVES_LLM_MODEL": "m"}
    one_line(lab.cli("run", "t", **env), 4, "NINELIVES_LLM_URL", "step 0")
    assert lab.snapshot("t") == before
