"""A tiny notes service on loopback that honours ``Idempotency-Key``.

    python notes_service.py 8780      # POST /notes stores a note; GET /notes lists them

A POST whose key was seen before returns the note stored the first time and
stores nothing new, the way payment and ticketing APIs behave. Port 0 takes
any free port; the first line printed (once it listens) names the URL.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NOTES: dict[str, dict[str, object]] = {}
POSTS: list[str] = []
LOCK = threading.Lock()


class Notes(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        key = self.headers.get("Idempotency-Key") or ""
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        with LOCK:
            POSTS.append(key)
            note = NOTES.get(key)
            if note is None:
                note = NOTES[key] = {"id": len(NOTES) + 1, "title": body.get("title", "")}
        self._reply(200, note)

    def do_GET(self) -> None:
        with LOCK:
            self._reply(200, {"notes": list(NOTES.values()), "posts": len(POSTS)})

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
        ("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 8780), Notes
    )
    print(f"notes service on http://127.0.0.1:{server.server_address[1]}/notes", flush=True)
    server.serve_forever()
