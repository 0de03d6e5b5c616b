"""An id gc removed is never used again: its idempotency keys (``<task_id>-<idx>``)
may name the old task's effects. Against a real idempotent "charge" service on
127.0.0.1, keyed by ``idem_key`` as a payment service's idempotency key is, a new
task ``demo`` would be answered with the old ``demo``'s charge and recorded done.
``create``, ``submit`` and ``fork`` of that id (in any case) are refused, exit 4,
saying when it was removed, with nothing stored; the control takes the record of
the removal away by hand and shows the old answer coming back."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from ninelives.testing import Lab

pytestmark = pytest.mark.crash

TOOLS = """
import json, os, urllib.request
from ninelives.tools import tool


@tool("charge")
def charge(step_input, ctx):
    request = urllib.request.Request(
        os.environ["CHARGE_URL"], data=json.dumps({"amount": step_input["amount"]}).encode(),
        headers={"Idempotency-Key": ctx.idem_key, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())
"""


class ChargeService:
    """Charges by idempotency key: a key seen before gets its first answer again."""

    def __init__(self) -> None:
        self.charges: dict[str, dict[str, Any]] = {}
        self.requests = 0
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                key = self.headers["Idempotency-Key"]
                service.requests += 1
                answer = service.charges.setdefault(
                    key, {"charge": len(service.charges) + 1, "amount": body["amount"], "key": key}
                )
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/charges"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def service() -> Iterator[ChargeService]:
    found = ChargeService()
    try:
        yield found
    finally:
        found.close()


def _setup(lab: Lab, service: ChargeService) -> None:
    lab.write("charge_tools.py", TOOLS)
    lab.base_env.update(NINELIVES_TOOLS="charge_tools", CHARGE_URL=service.url)
    for amount in (30, 50):
        lab.write_plan(
            {"goal": "charge", "steps": [{"tool": "charge", "input": {"amount": amount}}]},
            f"charge{amount}.json",
        )


def _forget_removal(lab: Lab) -> None:
    """The control's damage: the record of the removal taken away, around ninelives."""
    if lab.sqlite_path is not None:
        conn = sqlite3.connect(lab.sqlite_path, isolation_level=None)
        try:
            conn.execute("DELETE FROM removed_tasks")
        finally:
            conn.close()
        return
    import psycopg

    with psycopg.connect(lab.db, autocommit=True) as conn2:
        conn2.execute("DELETE FROM removed_tasks")


def _charged(lab: Lab, task_id: str) -> Any:
    return lab.cli("status", task_id, "--outputs", "--json").json()["steps"][0]["output"]


def test_an_id_gc_removed_is_refused_and_the_old_charge_never_answers(
    lab: Lab, service: ChargeService
) -> None:
    _setup(lab, service)
    assert lab.cli("create", "demo", "charge30.json").returncode == 0
    assert lab.cli("run", "demo").returncode == 0
    assert _charged(lab, "demo") == {"charge": 1, "amount": 30, "key": "demo-0"}
    assert lab.cli("create", "other", "charge50.json").returncode == 0
    gone = lab.cli("gc", "--older-than", "0s", "--status", "done", "--json").json()
    assert gone["removed"] == [{"task": "demo", "status": "done"}]

    before = lab.fingerprint("other")
    attempts = [
        ("create", "demo", "charge50.json"),
        ("create", "DEMO", "charge50.json"),
        ("submit", "demo", "charge50.json"),
        ("fork", "other", "Demo", "--from", "0"),
    ]
    for args in attempts:
        refused = lab.cli(*args)
        assert refused.returncode == 4, refused
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1, refused.stderr
        assert "was used by a task that gc removed" in lines[0], lines
        assert " UTC" in lines[0], lines  # when it was removed
        assert "Traceback" not in refused.stderr
    assert lab.fingerprint("other") == before  # nothing stored
    assert lab.cli("status", "demo").returncode == 1
    assert service.requests == 1

    # Another id is free, and charges anew.
    assert lab.cli("create", "demo2", "charge50.json").returncode == 0
    assert lab.cli("run", "demo2").returncode == 0
    assert _charged(lab, "demo2")["amount"] == 50


def test_control_without_the_record_the_old_charge_answers_the_new_task(
    lab: Lab, service: ChargeService
) -> None:
    """What the refusal prevents: with the removal forgotten, a new ``demo``
    charging 50 is answered with the old charge of 30 and recorded done."""
    _setup(lab, service)
    assert lab.cli("create", "demo", "charge30.json").returncode == 0
    assert lab.cli("run", "demo").returncode == 0
    assert lab.cli("gc", "--older-than", "0s").returncode == 0
    _forget_removal(lab)
    assert lab.cli("create", "demo", "charge50.json").returncode == 0
    assert lab.cli("run", "demo").returncode == 0
    assert _charged(lab, "demo") == {"charge": 1, "amount": 30, "key": "demo-0"}
    assert service.requests == 2  # asked again, answered with the first charge
