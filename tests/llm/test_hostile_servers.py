"""Model clients against hostile loopback servers: trickled headers, huge replies,
error bodies that echo the API key.

Every client in src that speaks HTTP (the ``ollama`` and ``openai`` engines of
``llm`` steps and agents, and ``summarize`` with ``AGENT_LLM=ollama``) goes
through one bounded exchange (:mod:`ninelives.exchange`): the whole exchange
ends at ``NINELIVES_LLM_TIMEOUT``, a reply over the cap is refused without
being read whole, and the key is redacted before any message is cut. Each
test bounds its own wait (a thread joined with a limit, a subprocess
timeout); nothing is measured by time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from errorlines import one_line
from ninelives.errors import ToolError
from ninelives.exchange import redact, snippet
from ninelives.llm import MAX_REPLY_BYTES, EngineConfig, open_engine
from ninelives.settings import Settings
from ninelives.testing import Lab
from ninelives.testing.fakellm import HUGE_BYTES, FakeModelServer, Turn, fake_model_server
from ninelives.tools.builtin import make_summarize

SECRET = "sk-planted-secret-5678901234567890"
CONVERSATION = [{"role": "user", "content": "Hello?"}]
#: How long a test waits for a client that should have given up long before.
BOUND = 30.0


def _engine_call(engine: str, fake: FakeModelServer, timeout: str) -> Callable[[], Any]:
    url = fake.url + "/v1" if engine == "openai" else fake.url
    config = EngineConfig.from_env(
        {"NINELIVES_LLM": engine, "NINELIVES_LLM_URL": url, "NINELIVES_LLM_MODEL": "m1",
         "NINELIVES_LLM_TIMEOUT": timeout, "NINELIVES_LLM_API_KEY": SECRET}
    )  # fmt: skip
    return lambda: open_engine(config).chat(CONVERSATION)


def _summarize_call(fake: FakeModelServer, timeout: float) -> Callable[[], Any]:
    settings = Settings(llm="ollama", ollama_url=fake.url, llm_timeout=timeout)
    tool = make_summarize(settings)
    return lambda: tool.fn({"from": 0}, {0: {"text": "Line one\nLine two"}}, "t-1")


def _caller(fake: FakeModelServer, client: str, timeout: str) -> Callable[[], Any]:
    if client == "summarize":
        return _summarize_call(fake, float(timeout))
    return _engine_call(client, fake, timeout)


def _bounded(call: Callable[[], Any]) -> BaseException | None:
    """What ``call`` raised in a thread, which must be over within :data:`BOUND`."""
    caught: list[BaseException | None] = [None]

    def target() -> None:
        try:
            call()
        except BaseException as exc:  # handed to the test
            caught[0] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(BOUND)
    assert not thread.is_alive(), f"the client still waits after {BOUND} s"
    return caught[0]


CLIENTS = ["ollama", "openai", "summarize"]
LLM_PLAN = {
    "steps": [
        {"tool": "fetch", "input": {"path": "input/notes.txt"}},
        {"tool": "llm", "input": {"prompt": "Sum up.", "from": [0]}},
    ]
}


def _llm_task(lab: Lab) -> None:
    lab.write("input/notes.txt", "Alpha\nBeta\n")
    lab.write_plan(LLM_PLAN)
    assert lab.cli("create", "t", "plan.json").returncode == 0


@pytest.mark.parametrize("client", CLIENTS)
def test_a_trickled_status_line_ends_at_the_timeout(client: str) -> None:
    """One byte a second keeps every read under a 2 s socket timeout; the whole
    exchange still ends at 2 s with the timeout's one line."""
    with fake_model_server("trickle", hang_seconds=2 * BOUND) as fake:
        error = _bounded(_caller(fake, client, "2"))
        assert fake.count() == 1
    assert isinstance(error, ToolError), error
    assert "no reply within 2 s (NINELIVES_LLM_TIMEOUT)" in str(error)
    assert str(error).startswith("ollama at " if client == "summarize" else f"{client} at ")


def test_run_against_a_trickling_server_fails_its_step_instead_of_hanging(lab: Lab) -> None:
    _llm_task(lab)
    with fake_model_server("trickle", hang_seconds=4 * BOUND) as fake:
        ran = lab.cli(
            "run", "t", timeout=2 * BOUND, AGENT_MAX_ATTEMPTS="1", NINELIVES_LLM="openai",
            NINELIVES_LLM_URL=fake.url + "/v1", NINELIVES_LLM_MODEL="m1",
            NINELIVES_LLM_TIMEOUT="2",
        )  # fmt: skip
    assert ran.returncode == 2, ran
    assert "Traceback" not in ran.stderr
    [error] = [e["error"] for e in lab.snapshot("t").events if e["kind"] == "step_error"]
    assert "no reply within 2 s" in error
    assert lab.cli("verify", "t").returncode == 0


@pytest.mark.parametrize("client", CLIENTS)
def test_a_reply_over_the_cap_is_refused_without_reading_it_whole(client: str) -> None:
    with fake_model_server("huge") as fake:
        error = _bounded(_caller(fake, client, "60"))
        taken = fake.sent
    assert isinstance(error, ToolError), error
    assert f"the reply is larger than {MAX_REPLY_BYTES} bytes" in str(error)
    assert taken < HUGE_BYTES // 2  # the cap, plus what the sockets buffered


def test_summarize_with_ollama_fails_its_step_on_a_huge_reply(lab: Lab) -> None:
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    with fake_model_server("huge") as fake:
        ran = lab.cli("run", "t", timeout=4 * BOUND, AGENT_MAX_ATTEMPTS="1", AGENT_LLM="ollama",
                      OLLAMA_URL=fake.url)  # fmt: skip
        assert fake.sent < HUGE_BYTES // 2
    assert ran.returncode == 2, ran
    assert "Traceback" not in ran.stderr
    assert f"larger than {MAX_REPLY_BYTES} bytes" in ran.stderr.splitlines()[-1]
    [error] = [e["error"] for e in lab.snapshot("t").events if e["kind"] == "step_error"]
    assert f"larger than {MAX_REPLY_BYTES} bytes" in error
    assert lab.cli("verify", "t").returncode == 0


def test_summarize_with_ollama_keeps_half_an_emoji_as_a_replacement(lab: Lab) -> None:
    """A summary with an escaped lone surrogate is stored with U+FFFD, asked once."""
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    with fake_model_server(Turn(text="Three lines \ud83d")) as fake:
        ran = lab.cli("run", "t", AGENT_LLM="ollama", OLLAMA_URL=fake.url)
        assert fake.count("/api/generate") == 1, ran.stderr
    assert ran.returncode == 0, ran.stderr
    [summary] = [o for o in lab.snapshot("t").outputs.values() if "summary" in o]
    assert summary == {"summary": "Three lines \ufffd", "engine": "ollama"}


# -- the API key ------------------------------------------------------------------


def test_redact_removes_the_key_and_a_key_cut_at_the_end() -> None:
    assert redact(f"a {SECRET} b {SECRET}", SECRET) == "a *** b ***"
    assert redact(f"cut here: {SECRET[:10]}", SECRET, cut=True) == "cut here: ***"
    assert redact(f"whole: {SECRET[:10]}", SECRET) == f"whole: {SECRET[:10]}"
    assert redact("ends with s", SECRET) == "ends with s"
    assert redact(SECRET, "") == SECRET
    shown = snippet(("x" * 100 + SECRET).encode(), SECRET)
    assert SECRET[:4] not in shown
    assert "***" in shown
    assert SECRET[:4] not in snippet((" " * 3000 + SECRET[:9]).encode(), SECRET, cut=True)


@pytest.mark.parametrize("engine", ["ollama", "openai"])
@pytest.mark.parametrize("fault", ["echo_key", "echo_key_cut"])
def test_an_error_body_echoing_the_key_shows_only_the_redacted_form(
    engine: str, fault: str
) -> None:
    with fake_model_server(fault) as fake:
        error = _bounded(_engine_call(engine, fake, "10"))
    assert isinstance(error, ToolError), error
    message = str(error)
    assert ("HTTP 401" if fault == "echo_key" else "HTTP 500") in message
    assert SECRET[:4] not in message, message
    assert "Bearer ***" in message


@pytest.mark.parametrize("fault", ["echo_key", "echo_key_cut"])
def test_the_echoed_key_reaches_no_stderr_journal_export_or_database(lab: Lab, fault: str) -> None:
    """The key echoed by a 401/500 body: the step error, the journal, ``export``,
    ``status`` and stderr hold ``***``, and no file of the database holds any
    part of the key."""
    _llm_task(lab)
    with fake_model_server(fault) as fake:
        env = {"NINELIVES_LLM": "openai", "NINELIVES_LLM_URL": fake.url + "/v1",
               "NINELIVES_LLM_MODEL": "m1", "NINELIVES_LLM_API_KEY": SECRET}  # fmt: skip
        ran = lab.cli("run", "t", AGENT_MAX_ATTEMPTS="1", **env)
        assert fake.requests[0].headers["authorization"] == f"Bearer {SECRET}"
    assert ran.returncode == 2, ran
    texts = [ran.stdout, ran.stderr]
    for args in (("status", "t", "--outputs"), ("export", "t"), ("status", "t", "--json")):
        shown = lab.cli(*args)
        texts += [shown.stdout, shown.stderr]
    [error] = [e["error"] for e in lab.snapshot("t").events if e["kind"] == "step_error"]
    assert "Bearer ***" in error
    assert "Bearer ***" in ran.stderr
    assert not [text for text in texts if SECRET[:4] in text]
    if lab.sqlite_path is not None:
        for path in Path(lab.sqlite_path).parent.glob(Path(lab.sqlite_path).name + "*"):
            if path.is_file():
                assert SECRET[:4].encode() not in path.read_bytes(), path


@pytest.mark.parametrize("key", [SECRET + "\r", SECRET + "\n", f"{SECRET[:8]}\u00e9{SECRET[8:]}"])
def test_a_key_no_header_can_carry_is_refused_before_the_step(lab: Lab, key: str) -> None:
    """A key with a line break (read from a file with CRLF endings) or a character
    beyond ASCII is refused before the step starts (exit 4, one line, nothing
    written), never sent and never shown: the request it made was refused by
    http.client at every attempt, failing the task with the key in the error."""
    _llm_task(lab)
    before = lab.snapshot("t")
    with fake_model_server(Turn(text="fine")) as fake:
        env = {"NINELIVES_LLM": "openai", "NINELIVES_LLM_URL": fake.url + "/v1",
               "NINELIVES_LLM_MODEL": "m1", "NINELIVES_LLM_API_KEY": key}  # fmt: skip
        ran = lab.cli("run", "t", **env)
        assert fake.count() == 0
    assert SECRET[:4] not in ran.stdout + ran.stderr, ran.stderr
    one_line(ran, 4, "NINELIVES_LLM_API_KEY", "step 1")
    assert lab.snapshot("t") == before
