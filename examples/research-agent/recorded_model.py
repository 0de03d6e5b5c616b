"""A recorded model on loopback: one conversation replayed in Ollama's wire format.

    python recorded_model.py 8781    # POST /api/chat answers; GET /asked lists the turns asked

No model and no download: each turn's reply is the one recorded below (read
the three notes; publish the report and post its title; answer). The turn is
the number of assistant messages the conversation already holds, so a
conversation asked again after a kill gets the same reply again, as a
deterministic model would give. ``GET /asked`` lists the turn of every request,
in order: a turn ninelives committed before a kill is never asked again.
Port 0 takes any free port; the first line printed names the URL.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPORT = """# Open questions
- Storage: how large may a step's output grow?
- Workers: what lease length suits hour-long steps?
- Models: which local model is good enough for reports?
"""
#: The recorded replies, turn by turn: ``(text, [(tool, arguments), ...])``.
TURNS: list[tuple[str, list[tuple[str, dict[str, str]]]]] = [
    ("", [("fetch", {"path": f"input/{name}.md"}) for name in ("alpha", "beta", "gamma")]),
    (
        "",
        [
            ("write_artifact", {"name": "report.md", "text": REPORT}),
            ("post_note", {"title": "Open questions"}),
        ],
    ),
    ("The report is published and its title posted to the notes service.", []),
]
ASKED: list[int] = []
LOCK = threading.Lock()


def reply(turn: int, model: str) -> dict[str, object]:
    """Ollama's non-streaming ``/api/chat`` reply for ``turn`` (the last one repeats)."""
    text, calls = TURNS[min(turn, len(TURNS) - 1)]
    message: dict[str, object] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [{"function": {"name": n, "arguments": a}} for n, a in calls]
    return {
        "model": model,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "message": message,
        "done": True,
        "prompt_eval_count": 40 + 30 * turn,
        "eval_count": len(json.dumps(message).split()),
    }


class Model(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        if self.path != "/api/chat":
            self._reply(404, {"error": "not found"})
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        turn = sum(1 for m in body.get("messages", ()) if m.get("role") == "assistant")
        with LOCK:
            ASKED.append(turn)
        self._reply(200, reply(turn, str(body.get("model", ""))))

    def do_GET(self) -> None:
        with LOCK:
            self._reply(200, {"asked": list(ASKED)})

    def _reply(self, status: int, payload: object) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(
        ("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 8781), Model
    )
    print(f"recorded model on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()
