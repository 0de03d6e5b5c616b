"""``ninelives ui``: a read-only local web view of the tasks in a database.

Standard library only (:mod:`http.server`). Pages are plain HTML that works
without JavaScript and refreshes itself while tasks run:

- ``/``: the tasks, newest first, filtered by ``status`` and ``queue``, paged;
  on PostgreSQL also the fleet: each worker holding a lease, its tasks and
  when its lease expires;
- ``/task/ID``: the task's timeline (the page of ``ninelives report``);
- ``/api/tasks``, ``/api/tasks/ID``: the same data as JSON;
- ``/metrics``: Prometheus text format.

Nothing is ever written. It binds to loopback unless told otherwise, and
answers only requests addressed to the name it serves on (a web page cannot
reach it through DNS rebinding).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

from ..errors import InputError, NineLivesError, UnknownTask
from ..humanize import age, html_text
from ..models import TaskStatus

PAGE_SIZE = 50
#: The deepest page: the listing reads ``page x PAGE_SIZE`` rows to find it.
MAX_PAGE = 200
#: Seconds between refreshes of a page that shows an unfinished task.
REFRESH = 2
LOOPBACK = ("127.0.0.1", "localhost", "::1")
_UNFINISHED = {"pending", "running"}
_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def _e(value: object) -> str:
    return html_text(value)


class Viewer:
    """The read-only queries behind the pages, each on a store opened for it."""

    def __init__(self, url: str, open_store: Callable[[], Any]) -> None:
        self.url = url
        self._open = open_store

    @contextmanager
    def store(self) -> Iterator[Any]:
        store = self._open()
        try:
            yield store
        finally:
            store.close()

    def tasks(self, status: str | None, queue: str | None, page: int) -> tuple[list[Any], bool]:
        """One page of tasks, newest first, and whether an older page exists."""
        want = (page + 1) * PAGE_SIZE + 1
        with self.store() as store:
            rows = store.list_tasks(statuses=[status] if status else [], queue=queue, limit=want)
        return rows[page * PAGE_SIZE : (page + 1) * PAGE_SIZE], len(rows) == want

    def fleet(self) -> list[dict[str, Any]] | None:
        """PostgreSQL's workers with a lease and their tasks; None on SQLite."""
        with self.store() as store:
            if store.dialect != "postgres":
                return None
            held = store.tasks_in_status(TaskStatus.RUNNING.value)
        now = time.time()
        workers: dict[str, dict[str, Any]] = {}
        for hold in held:
            if hold.lease_owner is None:
                continue
            worker = workers.setdefault(
                hold.lease_owner, {"worker": hold.lease_owner, "tasks": [], "live": False}
            )
            left = None if hold.lease_expires_at is None else hold.lease_expires_at - now
            worker["tasks"].append(
                {"task": hold.id, "queue": hold.queue, "epoch": hold.lease_epoch,
                 "expired": hold.expired,
                 "lease_left": None if left is None else round(left, 1)}
            )  # fmt: skip
            worker["live"] = worker["live"] or not hold.expired
        return sorted(workers.values(), key=lambda w: w["worker"])

    def task(self, task_id: str) -> tuple[Any, list[Any]]:
        with self.store() as store:
            return store.get_task(task_id), store.events(task_id)


class Handler(BaseHTTPRequestHandler):
    """One request; ``viewer`` and ``hosts`` are set on the server."""

    server: Server
    server_version = "ninelives"
    sys_version = ""

    def do_GET(self) -> None:
        if not self._host_allowed():
            self._send(421, "text/plain; charset=utf-8", b"misdirected request\n")
            return
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        try:
            self._route(url.path, query)
        except UnknownTask as exc:
            self._error(404, str(exc))
        except InputError as exc:
            self._error(400, str(exc))
        except NineLivesError as exc:
            self._error(503, str(exc))

    def do_HEAD(self) -> None:
        self._send(405, "text/plain; charset=utf-8", b"")

    def do_POST(self) -> None:
        self._error(405, "this view is read-only")

    do_PUT = do_DELETE = do_PATCH = do_POST

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The server's own errors (a method without a handler: 501, a request
        line it cannot parse: 400) with the headers of every other answer."""
        self.close_connection = True
        said = message or self.responses.get(code, ("",))[0]
        self._send(code, "text/plain; charset=utf-8", f"{code} {said}\n".encode())

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a local viewer: no access log on the terminal

    def _host_allowed(self) -> bool:
        host = (self.headers.get("Host") or "").lower()
        return host in self.server.hosts

    def _route(self, path: str, query: Mapping[str, str]) -> None:
        viewer = self.server.viewer
        if path == "/":
            status, queue, page = _filters(query)
            rows, more = viewer.tasks(status, queue, page)
            body = _index(rows, viewer.fleet(), status, queue, page, more, viewer.url)
            self._send(200, "text/html; charset=utf-8", body.encode())
        elif path == "/api/tasks":
            status, queue, page = _filters(query)
            rows, more = viewer.tasks(status, queue, page)
            now = time.time()
            data = {"tasks": [r.as_json(now) for r in rows], "page": page, "more": more,
                    "fleet": viewer.fleet()}  # fmt: skip
            self._json(data)
        elif path.startswith("/api/tasks/"):
            task, _ = viewer.task(_task_id(path.removeprefix("/api/tasks/")))
            self._json({**task.as_status(), "outputs": {s.idx: s.output for s in task.steps}})
        elif path.startswith("/task/"):
            from ..report import render
            from ..version import __version__

            task, events = viewer.task(_task_id(path.removeprefix("/task/")))
            text = render(task, events, version=__version__)
            extra = '<p class="nav"><a href="/">← all tasks</a></p>'
            if task.status.value in _UNFINISHED:
                extra = f'<meta http-equiv="refresh" content="{REFRESH}">' + extra
            text = text.replace("<main>", "<main>" + extra, 1)
            self._send(200, "text/html; charset=utf-8", text.encode())
        elif path == "/metrics":
            with viewer.store() as store:
                counts = store.metric_counts()
            self._send(200, "text/plain; version=0.0.4; charset=utf-8", _metrics(counts).encode())
        else:
            self._error(404, f"no page at {path}")

    def _json(self, data: Any) -> None:
        from ..journal import printable_json

        # Strict JSON: a NaN an older version stored is null, as in `status --outputs`.
        body = printable_json(data, sort_keys=True).encode()
        self._send(200, "application/json", body)

    def _error(self, code: int, message: str) -> None:
        if urlsplit(self.path).path.startswith("/api/"):
            # A script reads the API with a JSON parser: its errors too.
            said = json.dumps({"error": message, "status": code}, sort_keys=True)
            self._send(code, "application/json", said.encode())
            return
        page = f"<!DOCTYPE html><title>{code}</title><p>{_e(message)}</p>"
        self._send(code, "text/html; charset=utf-8", page.encode())

    def _send(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", _CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)


def _task_id(text: str) -> str:
    from urllib.parse import unquote

    from ..names import check_task_id

    return check_task_id(unquote(text))


def _filters(query: Mapping[str, str]) -> tuple[str | None, str | None, int]:
    from ..names import check_queue

    status = query.get("status") or None
    if status is not None and status not in {s.value for s in TaskStatus}:
        raise InputError(f"unknown status {status!r}")
    queue = query.get("queue") or None
    if queue is not None:
        check_queue(queue)
    from .common import integer  # the options' rule: int() reads "1_0" and other digits

    try:
        page = integer(query.get("page", "0"))
    except ValueError:
        raise InputError("page must be a number") from None
    if not 0 <= page <= MAX_PAGE:
        raise InputError(f"page must be 0-{MAX_PAGE}")
    return status, queue, page


def _index(
    rows: list[Any],
    fleet: list[dict[str, Any]] | None,
    status: str | None,
    queue: str | None,
    page: int,
    more: bool,
    url: str,
) -> str:
    now = time.time()
    live = any(r.status in _UNFINISHED for r in rows) or bool(fleet)
    refresh = f'<meta http-equiv="refresh" content="{REFRESH}">' if live else ""
    options = "".join(
        f'<option value="{s.value}"{" selected" if s.value == status else ""}>{s.value}</option>'
        for s in TaskStatus
    )
    form = (
        '<form class="filters" method="get" action="/">'
        f'<label>status <select name="status"><option value="">any</option>{options}</select>'
        f'</label> <label>queue <input name="queue" value="{_e(queue or "")}" size="12">'
        '</label> <button type="submit">filter</button></form>'
    )
    head = (
        "<tr><th>task</th><th>status</th><th>steps</th><th>attempts</th><th>age</th>"
        "<th>last event</th><th>goal</th></tr>"
    )
    body = "".join(
        f'<tr class="task s-{_e(r.status)}"><td><a href="/task/{quote(r.id)}">{_e(r.id)}</a></td>'
        f"<td>{_e(r.status)}</td><td>{r.steps_done}/{r.steps_total}</td><td>{r.attempts}</td>"
        f"<td>{age(now - r.created_at)}</td><td>{_e(r.last_event or '')}</td>"
        f'<td class="goal">{_e(r.goal[:120])}</td></tr>'
        for r in rows
    )
    table = f'<table class="tasks">{head}{body}</table>' if rows else "<p>No task.</p>"
    keep = {k: v for k, v in (("status", status), ("queue", queue)) if v}
    nav = []
    if page > 0:
        nav.append(
            f'<a rel="prev" href="/?{_e(urlencode({**keep, "page": page - 1}))}">← newer</a>'
        )
    if more:
        nav.append(
            f'<a rel="next" href="/?{_e(urlencode({**keep, "page": page + 1}))}">older →</a>'
        )
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">{refresh}'
        f"<title>ninelives: {_e(_shown(url))}</title><style>{_STYLE}</style></head><body><main>"
        f"<h1>ninelives <small>{_e(_shown(url))}</small></h1>{form}{_fleet(fleet)}"
        f'<h2>Tasks</h2>{table}<p class="nav">{" ".join(nav)}</p></main></body></html>'
    )


def _shown(url: str) -> str:
    from ..store.conninfo import redact_url

    return redact_url(url)


def _fleet(fleet: list[dict[str, Any]] | None) -> str:
    if fleet is None:
        return ""
    if not fleet:
        return '<h2>Fleet</h2><p class="fleet">No worker holds a task.</p>'
    rows = []
    for w in fleet:
        for t in w["tasks"]:
            left = "expired" if t["expired"] else f"{t['lease_left']} s left"
            rows.append(
                f'<tr class="lease{" expired" if t["expired"] else ""}"><td>{_e(w["worker"])}</td>'
                f"<td>{'live' if w['live'] else 'dead'}</td>"
                f'<td><a href="/task/{quote(t["task"])}">{_e(t["task"])}</a></td>'
                f"<td>{_e(t['queue'] or '')}</td><td>{t['epoch']}</td><td>{_e(left)}</td></tr>"
            )
    head = (
        "<tr><th>worker</th><th>state</th><th>task</th><th>queue</th><th>epoch</th>"
        "<th>lease</th></tr>"
    )
    return f'<h2>Fleet</h2><table class="fleet">{head}{"".join(rows)}</table>'


def _metrics(counts: Any) -> str:
    lines = [
        "# HELP ninelives_tasks Tasks by status.",
        "# TYPE ninelives_tasks gauge",
        *(f'ninelives_tasks{{status="{s}"}} {counts.tasks.get(s, 0)}' for s in _statuses(counts)),
        "# HELP ninelives_steps Steps by status.",
        "# TYPE ninelives_steps gauge",
        *(f'ninelives_steps{{status="{s}"}} {n}' for s, n in sorted(counts.steps.items())),
        # Gauges, not counters: gc deletes finished tasks, and their counts with them.
        "# HELP ninelives_step_attempts Step attempts started (each retry and rerun).",
        "# TYPE ninelives_step_attempts gauge",
        f"ninelives_step_attempts {counts.attempts}",
        "# HELP ninelives_step_recoveries Steps found running after a crash.",
        "# TYPE ninelives_step_recoveries gauge",
        f"ninelives_step_recoveries {counts.recoveries}",
        *_step_metrics(counts),
    ]
    return "\n".join(lines) + "\n"


def _step_metrics(counts: Any) -> list[str]:
    """Attempts started and finished, and how long the finished ones took, read
    from the journal at each scrape (one aggregate query: see ``metric_durations``)."""
    done = counts.durations
    # Counters as Prometheus names them, though gc deleting finished tasks
    # lowers them with their events: a scraper reads that as a counter reset.
    lines = [
        "# HELP ninelives_steps_started_total Step attempts started (step_started events).",
        "# TYPE ninelives_steps_started_total counter",
        f"ninelives_steps_started_total {counts.started}",
        "# HELP ninelives_steps_finished_total Step attempts finished, by outcome.",
        "# TYPE ninelives_steps_finished_total counter",
        *(f'ninelives_steps_finished_total{{outcome="{d.outcome}"}} {d.attempts}' for d in done),
        "# HELP ninelives_step_duration_seconds Step attempts from start to done or error.",
        "# TYPE ninelives_step_duration_seconds histogram",
    ]
    name = "ninelives_step_duration_seconds"
    for d in counts.durations:
        label = f'outcome="{d.outcome}"'
        lines += [f'{name}_bucket{{{label},le="{le:g}"}} {n}' for le, n in d.buckets]
        lines += [
            f'{name}_bucket{{{label},le="+Inf"}} {d.attempts}',
            f"{name}_sum{{{label}}} {d.seconds:.6f}",
            f"{name}_count{{{label}}} {d.attempts}",
        ]
    return lines


def _statuses(counts: Any) -> list[str]:
    known = [s.value for s in TaskStatus]
    # Statuses this version does not know (a newer writer) are counted too; their
    # names are escaped as Prometheus label values require.
    other = sorted(s for s in counts.tasks if s not in known)
    return known + [json.dumps(s)[1:-1] for s in other]


class Server(ThreadingHTTPServer):
    """The HTTP server, with the viewer and the Host names it answers to."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], viewer: Viewer, names: list[str]) -> None:
        super().__init__(address, Handler)
        self.viewer = viewer
        port = self.server_address[1]
        self.hosts = {f"{n}:{port}" for n in names} | {f"[{n}]:{port}" for n in names}

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A request that raised: one line on stderr, never the traceback
        :mod:`socketserver` prints; a reader that went away mid-answer (a closed
        tab, a reload: EPIPE, ECONNRESET, a timeout) is no error at all."""
        import sys

        from .output import say

        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return
        say(f"ninelives: error: ui: a request from {client_address[0]} failed: {exc!r}")


def serve(
    url: str,
    open_store: Callable[[], Any],
    *,
    host: str,
    port: int,
    allow_remote: bool,
    names: list[str] | None = None,
) -> Server:
    """A :class:`Server` bound to ``host:port`` (0: any free port); serve with
    ``serve_forever``. A host other than loopback needs ``allow_remote``."""
    if host not in LOOPBACK and not allow_remote:
        raise InputError(
            f"--host {host!r} would serve the database to other machines: pass --allow-remote "
            "as well if that is what you want (there is no authentication)"
        )
    if not 0 <= port <= 65535:
        # socket.bind raises OverflowError, not OSError, for these.
        raise InputError(f"--port must be 0-65535, got {port}")
    family_host = "::1" if host == "::1" else host
    allowed = names or ([host] if host not in LOOPBACK else list(LOOPBACK))
    try:
        return Server((family_host, port), Viewer(url, open_store), allowed)
    except OSError as exc:
        raise InputError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


_STYLE = """
:root { --bg:#fff; --fg:#1d232a; --muted:#5b6570; --line:#d5dbe1; --ok:#2f9e44;
  --warn:#e8890c; --bad:#d6336c; --link:#1c7ed6; }
@media (prefers-color-scheme: dark) { :root { --bg:#15191e; --fg:#e3e7eb; --muted:#9aa5b1;
  --line:#343c45; --ok:#51cf66; --warn:#ffa94d; --bad:#f06595; --link:#4dabf7; } }
body { background:var(--bg); color:var(--fg); margin:0;
  font:14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; }
main { max-width:1120px; margin:0 auto; padding:24px; }
h1 { font-size:22px; } h1 small { color:var(--muted); font-weight:400; font-size:14px; }
h2 { font-size:17px; margin:24px 0 8px; }
table { border-collapse:collapse; width:100%; }
th, td { text-align:left; padding:4px 8px; border-bottom:1px solid var(--line); }
th { color:var(--muted); font-size:12px; }
a { color:var(--link); } .goal { color:var(--muted); }
.s-done td:nth-child(2) { color:var(--ok); } .s-failed td:nth-child(2),
.s-cancelled td:nth-child(2) { color:var(--bad); }
.s-running td:nth-child(2), .s-blocked td:nth-child(2),
.s-waiting td:nth-child(2) { color:var(--warn); }
.lease.expired td { color:var(--bad); }
.filters { display:flex; gap:12px; align-items:center; }
.nav a { margin-right:16px; }
"""
