"""``ninelives ui``: a real server on 127.0.0.1, read with urllib and a headless Chromium."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import socket
import sqlite3
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import browser
from ninelives.testing import Lab

HOSTILE = "<script>document.documentElement.setAttribute('data-pwned','1')</script>"


class View:
    """A running ``ninelives ui`` and what it serves."""

    def __init__(self, lab: Lab, *args: str) -> None:
        self.proc = lab.spawn("ui", "--port", "0", *args)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        found = re.match(r"serving (http://127\.0\.0\.1:\d+/) \(read-only", line)
        assert found, (line, self.proc.stderr.read() if self.proc.poll() is not None else "")
        self.base = found.group(1)

    def get(self, path: str, **headers: str) -> tuple[int, str, str]:
        request = urllib.request.Request(self.base + path.lstrip("/"), headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, answer.headers["Content-Type"], answer.read().decode()
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, exc.headers["Content-Type"], exc.read().decode()

    def json(self, path: str) -> Any:
        code, kind, body = self.get(path)
        assert (code, kind) == (200, "application/json"), body
        return json.loads(body)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


@pytest.fixture
def view_of(lab: Lab) -> Iterator[Any]:
    views: list[View] = []

    def start(*args: str) -> View:
        views.append(View(lab, *args))
        return views[-1]

    yield start
    for v in views:
        v.close()


def _tasks(lab: Lab) -> None:
    """A task killed twice and resumed, a failed one and a pending one in a queue."""
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    assert lab.cli("run", "t", AGENT_CRASH_AT="after_effect:1").returncode == -9
    assert lab.cli("run", "t", AGENT_CRASH_AT="before_effect:2").returncode == -9
    assert lab.cli("run", "t").returncode == 0
    lab.write_plan({"goal": HOSTILE, "steps": [{"tool": "fetch", "input": {"path": "none"}}]},
                   "bad.json")  # fmt: skip
    assert lab.cli("create", "f", "bad.json").returncode == 0
    assert lab.cli("run", "f").returncode == 2
    assert lab.cli("create", "q", "plan.json", "--queue", "nightly").returncode == 0


def test_the_list_is_in_the_html_and_the_api(lab: Lab, view_of: Any) -> None:
    _tasks(lab)
    view = view_of()
    code, kind, page = view.get("/")
    assert (code, kind) == (200, "text/html; charset=utf-8")
    assert re.findall(r'<tr class="task s-([a-z]+)"><td><a href="/task/(\w+)">', page) == [
        ("pending", "q"),
        ("failed", "f"),
        ("done", "t"),
    ]  # fmt: skip  (newest first)
    assert 'http-equiv="refresh"' in page  # a pending task: the page keeps itself fresh
    api = view.json("/api/tasks")
    assert [(t["task"], t["status"], t["steps_done"], t["steps_total"]) for t in api["tasks"]] == [
        ("q", "pending", 0, 3), ("f", "failed", 0, 1), ("t", "done", 3, 3),
    ]  # fmt: skip
    assert api["more"] is False
    assert [t["task"] for t in view.json("/api/tasks?status=done")["tasks"]] == ["t"]
    assert [t["task"] for t in view.json("/api/tasks?queue=nightly")["tasks"]] == ["q"]
    done_only = view.get("/?status=done")[2]
    assert 'http-equiv="refresh"' not in done_only  # nothing left to change
    assert view.json("/api/tasks/t")["steps"][2]["attempts"] == 2
    assert view.get("/api/tasks?status=nope")[0] == 400
    assert view.get("/api/tasks?page=x")[0] == 400
    assert view.get("/task/..%2f..%2fetc")[0] == 400
    assert view.get("/task/nope")[0] == 404
    assert view.get("/nothing")[0] == 404


def test_pages_load_in_chromium_and_a_hostile_goal_stays_text(
    lab: Lab, view_of: Any, tmp_path: Path
) -> None:
    _tasks(lab)
    view = view_of()
    dom = browser.dom(view.base)
    assert len(re.findall(r'<tr class="task ', dom)) == 3
    assert "data-pwned" not in dom.split("<body", 1)[0]
    goal = re.search(r'<tr class="task s-failed">.*?<td class="goal">(.*?)</td>', dom, re.S)
    assert goal is not None
    assert "<" not in goal.group(1)
    assert html.unescape(goal.group(1)) == HOSTILE
    timeline = browser.dom(view.base + "task/t")
    assert len(re.findall(r'<g class="attempt killed"', timeline)) == 2
    assert len(re.findall(r'<g class="mark recovered"', timeline)) == 2
    shot = browser.screenshot(view.base, tmp_path / "ui.png", height=420)
    keep = os.environ.get("NINELIVES_SCREENSHOTS")
    if keep:
        shutil.copy(shot, Path(keep) / "ui.png")


def test_stored_text_that_would_reorder_or_act_is_shown_escaped(lab: Lab, view_of: Any) -> None:
    """A goal holding a right-to-left override shows later text reversed (``pay
    \u202e01$ ot`` reads as "pay to $10"); a BEL in it, or an ESC in a workflow's
    step name, is not text: each reached the page raw. Escaped as the terminal
    views escape them; a newline and a tab a page lays out itself."""
    import ninelives
    from ninelives import runtime

    @ninelives.workflow("ui_odd_name")
    def odd(ctx: Any) -> Any:
        return ctx.step("a\x1bb", lambda: 1)

    lab.write("notes.txt", "n\n")
    goal = "pay \u202e01$ ot\x07x\tand\nmore"
    lab.write_plan({"goal": goal, "steps": [{"tool": "fetch", "input": {"path": "notes.txt"}}]})
    assert lab.cli("create", "t", "plan.json").returncode == 0
    with runtime.open(lab.db if "://" in lab.db else str(lab.root / lab.db)) as rt:
        rt.create("w", odd)
        rt.run("w")
    view = view_of()
    pages = {path: view.get(path) for path in ("/", "/task/t", "/task/w")}
    for path, (code, _, page) in pages.items():
        assert code == 200, page
        assert not set("\u202e\x07\x1b") & set(page), path
    assert "pay \\u202e01$ ot\\x07x\tand\nmore" in pages["/"][2]
    assert "pay \\u202e01$ ot\\x07x\tand\nmore" in pages["/task/t"][2]
    assert "a\\x1bb" in pages["/task/w"][2]


def test_paging_keeps_the_filters(lab: Lab, view_of: Any) -> None:
    from ninelives.runtime import open as open_runtime

    lab.guide_setup()
    url = lab.db if "://" in lab.db else str(lab.root / lab.db)
    with open_runtime(url) as rt:
        for n in range(55):
            rt.create(f"t{n:02d}", lab.root / "plan.json", queue="many")
    view = view_of()
    first = view.json("/api/tasks?queue=many")
    assert len(first["tasks"]) == 50
    assert first["more"] is True
    second = view.json("/api/tasks?queue=many&page=1")
    assert [t["task"] for t in second["tasks"]] == [f"t{n:02d}" for n in range(4, -1, -1)]
    assert second["more"] is False
    page = view.get("/?queue=many")[2]
    assert '<a rel="next" href="/?queue=many&amp;page=1">older →</a>' in page


def test_a_database_of_the_guides_layout_is_listed_as_it_is(sqlite_lab: Lab) -> None:
    """Schema version 0 (the guide's layout) has no queue column: ``ls`` and the
    list pages read it as no task in a queue, as ``status`` reads it, unchanged."""
    lab = sqlite_lab
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "schema" / "v0"
    expected = sorted(json.loads((fixture / "manifest.json").read_text())["tasks"])
    lab.root.mkdir(parents=True, exist_ok=True)
    db = lab.root / "state.db"
    shutil.copyfile(fixture / "state.db", db)
    pristine, files = db.read_bytes(), lab.files()
    listed = lab.cli("ls", "--json", "--limit", "100")
    assert listed.returncode == 0, listed
    assert sorted(t["task"] for t in listed.jsonl()) == expected
    assert {t["queue"] for t in listed.jsonl()} == {None}
    assert [t["task"] for t in lab.cli("ls", "--status", "done").jsonl()] == ["done"]
    in_queue = lab.cli("ls", "--queue", "q", "--json")
    assert (in_queue.returncode, in_queue.stdout) == (0, ""), in_queue
    view = View(lab)
    try:
        api, in_q = view.json("/api/tasks"), view.json("/api/tasks?queue=q")
        code, _, page = view.get("/")
    finally:
        view.close()
    assert sorted(t["task"] for t in api["tasks"]) == expected
    assert in_q["tasks"] == []
    assert code == 200, page
    assert '<a href="/task/done">' in page
    assert lab.files() == files
    assert db.read_bytes() == pristine


def test_metrics_count_tasks_steps_attempts_and_recoveries(lab: Lab, view_of: Any) -> None:
    _tasks(lab)
    code, kind, text = view_of().get("/metrics")
    assert code == 200
    assert kind.startswith("text/plain; version=0.0.4")
    values = dict(re.findall(r"^(ninelives_\S+) (\d+)$", text, re.M))
    assert values['ninelives_tasks{status="done"}'] == "1"
    assert values['ninelives_tasks{status="failed"}'] == "1"
    assert values['ninelives_tasks{status="pending"}'] == "1"
    assert values["ninelives_step_recoveries"] == "2"
    assert values['ninelives_steps{status="done"}'] == "3"


def test_it_is_read_only_and_answers_only_its_own_name(lab: Lab, view_of: Any) -> None:
    _tasks(lab)
    before = lab.fingerprint("t", "f", "q")
    view = view_of()
    assert view.get("/", Host="evil.example:80")[0] == 421  # DNS rebinding: refused
    port = view.base.rsplit(":", 1)[1].strip("/")
    assert view.get("/", Host=f"localhost:{port}")[0] == 200
    request = urllib.request.Request(view.base + "api/tasks", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as posted:
        urllib.request.urlopen(request, timeout=30)
    assert posted.value.code == 405
    posted.value.close()
    code, _, page = view.get("/task/t")
    assert code == 200
    assert "Content-Security-Policy" in page  # the report's own, besides the header
    assert lab.fingerprint("t", "f", "q") == before


@pytest.mark.parametrize("method", ["OPTIONS", "TRACE", "BREW"])
def test_a_method_it_has_no_handler_for_gets_the_views_own_headers(
    lab: Lab, view_of: Any, method: str
) -> None:
    """The server's built-in error page (501 for a method it does not know) had
    neither the Content-Security-Policy nor no-store of every other answer."""
    _tasks(lab)
    view = view_of()
    request = urllib.request.Request(view.base + "api/tasks", method=method)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code in (405, 501)
    headers = refused.value.headers
    refused.value.close()
    assert headers["Content-Security-Policy"], dict(headers)
    assert headers["Cache-Control"] == "no-store"
    assert headers["X-Content-Type-Options"] == "nosniff"


def test_other_hosts_need_an_explicit_flag(lab: Lab) -> None:
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    refused = lab.cli("ui", "--host", "0.0.0.0", "--port", "0")
    assert refused.returncode == 4
    assert refused.stderr.count("\n") == 1
    assert "--allow-remote" in refused.stderr
    # Empty (every interface to the socket) is refused too; the line shows the host
    # quoted, so an empty one or one holding a terminal escape is seen as such.
    for host, shown in (("", "--host ''"), ("\x1b[2J", "--host '\\x1b[2J'")):
        refused = lab.cli("ui", "--host", host, "--port", "0")
        assert refused.returncode == 4, refused
        assert refused.stderr.startswith(f"ninelives: error: {shown} would serve"), refused
        assert "\x1b" not in refused.stderr
    proc = lab.spawn("ui", "--host", "0.0.0.0", "--port", "0", "--allow-remote")
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("serving http://0.0.0.0:")
        assert proc.stderr is not None
        assert "WARNING: serving 0.0.0.0:" in proc.stderr.readline()
    finally:
        proc.terminate()
        proc.wait(30)
    missing = lab.cli("--db", str(lab.root / "none.db"), "ui", "--port", "0")
    assert missing.returncode == 5


@pytest.mark.postgres
def test_the_fleet_view_shows_a_workers_lease_and_task(pg_database: str, tmp_path: Path) -> None:
    lab = Lab(tmp_path / "lab", db=pg_database)
    try:
        lab.guide_setup()
        assert lab.cli("submit", "w", "plan.json").returncode == 0
        lab.spawn("worker", "--lease", "5", "--heartbeat", "1", "--poll", "0.05",
                  AGENT_STEP_DELAY="60")  # fmt: skip
        view = View(lab)
        try:
            deadline = time.monotonic() + 60
            while not (fleet := view.json("/api/tasks")["fleet"]):
                assert time.monotonic() < deadline, "the worker never claimed the task"
                time.sleep(0.1)
            [worker] = fleet
            assert worker["live"] is True
            assert [t["task"] for t in worker["tasks"]] == ["w"]
            assert 0 < worker["tasks"][0]["lease_left"] <= 5
            page = view.get("/")[2]
            assert '<table class="fleet">' in page
            assert '<a href="/task/w">w</a>' in page
        finally:
            view.close()
    finally:
        lab.reap()


def _histogram(text: str, name: str, outcome: str) -> tuple[list[tuple[str, int]], float, int]:
    """Buckets (le, cumulative count) in order, _sum and _count of one outcome's series."""
    label = f'outcome="{outcome}"'
    buckets = [
        (le, int(n))
        for le, n in re.findall(rf'^{name}_bucket\{{{label},le="([^"]+)"\}} (\d+)$', text, re.M)
    ]
    total = float(re.findall(rf"^{name}_sum\{{{label}\}} (\S+)$", text, re.M)[0])
    count = int(re.findall(rf"^{name}_count\{{{label}\}} (\d+)$", text, re.M)[0])
    return buckets, total, count


def test_metrics_histogram_of_step_durations(lab: Lab, view_of: Any) -> None:
    from ninelives.report import lanes
    from ninelives.runtime import open as open_runtime

    _tasks(lab)  # t: 3 steps, two killed attempts; f: 3 failed attempts of one step
    code, _, text = view_of().get("/metrics")
    assert code == 200
    name = "ninelives_step_duration_seconds"
    assert f"# TYPE {name} histogram" in text
    assert "# TYPE ninelives_steps_finished_total counter" in text
    url = str(lab.sqlite_path or lab.db)
    with open_runtime(url, create=False, readonly=True) as rt:
        events = [e for task in ("t", "f", "q") for e in rt.export(task)]
    # The same pairing as the report's timeline: every closed attempt, nothing twice.
    paired = [a for lane in lanes(events) for a in lane.attempts if a.end is not None]
    expected = {
        "done": [a.end - a.start for a in paired if a.error is None],  # type: ignore[operator]
        "error": [a.end - a.start for a in paired if a.error is not None],  # type: ignore[operator]
    }
    assert (len(expected["done"]), len(expected["error"])) == (3, 3)
    for outcome, durations in expected.items():
        buckets, total, count = _histogram(text, name, outcome)
        assert buckets[-1] == ("+Inf", count)
        assert count == len(durations)
        counts = [n for _, n in buckets]
        assert counts == sorted(counts)  # cumulative: never decreasing
        bounds = [float(le) for le, _ in buckets[:-1]]
        assert bounds == sorted(bounds)
        assert total == pytest.approx(sum(durations), abs=1e-3)
        for le, n in zip(bounds, counts, strict=False):
            assert n == sum(d <= le for d in durations)
        finished = f'ninelives_steps_finished_total{{outcome="{outcome}"}} {count}'
        assert finished in text.splitlines()
    started = len(paired) + 2  # and the two attempts killed before they ended
    assert f"ninelives_steps_started_total {started}" in text.splitlines()


def test_a_browser_that_goes_away_mid_answer_is_no_traceback(lab: Lab, view_of: Any) -> None:
    # An answer far larger than a socket buffer (a 500 kB output in the API's
    # JSON), its reader gone at once (a closed tab, a reload): the write fails
    # with EPIPE or ECONNRESET, which is no error of the view.
    lab.write("input/big.txt", "x" * 500_000)
    lab.write_plan({"goal": "g", "steps": [{"tool": "fetch", "input": {"path": "input/big.txt"}}]})
    assert lab.cli("create", "big", "plan.json").returncode == 0
    assert lab.cli("run", "big", "-q").returncode == 0
    view = view_of()
    port = int(view.base.rsplit(":", 1)[1].strip("/"))
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(f"GET /api/tasks/big HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            # Closed with a reset, unread: the server's next write fails.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    time.sleep(0.5)
    assert len(view.json("/api/tasks/big")["outputs"]["0"]["text"]) == 500_000  # still serving
    view.close()
    assert view.proc.stderr is not None
    assert view.proc.stderr.read() == ""


def test_metrics_count_a_task_whose_status_is_not_utf8_as_damaged(sqlite_lab: Lab) -> None:
    # One task's row, as a hand edit or another program could store it: the
    # scrape still answers for the whole database, that task counted as damaged.
    lab = sqlite_lab
    _tasks(lab)
    conn = sqlite3.connect(lab.root / "state.db")
    try:
        conn.execute("UPDATE tasks SET status = CAST(X'646f6e65ff' AS TEXT) WHERE id = 't'")
        conn.execute("UPDATE steps SET status = CAST(X'646f6e65ff' AS TEXT) WHERE task_id = 'q'")
        conn.commit()
    finally:
        conn.close()
    view = View(lab)
    try:
        code, _, text = view.get("/metrics")
    finally:
        view.close()
    assert code == 200, text
    values = dict(re.findall(r"^(ninelives_\S+) (\d+)$", text, re.M))
    assert values['ninelives_tasks{status="damaged"}'] == "1"
    assert values['ninelives_tasks{status="failed"}'] == "1"
    assert values['ninelives_tasks{status="pending"}'] == "1"
    assert values['ninelives_steps{status="damaged"}'] == "3"
    assert values['ninelives_steps{status="done"}'] == "3"
    assert values["ninelives_step_recoveries"] == "2"


def test_the_api_is_strict_json_for_an_output_an_older_version_stored_with_nan(
    sqlite_lab: Lab,
) -> None:
    # NaN and the infinities are refused when written now, but a row of an older
    # version (or a hand edit) may hold them: the API gives them as null, as
    # status --outputs and export do, never as text no JSON parser accepts.
    lab = sqlite_lab
    _tasks(lab)
    conn = sqlite3.connect(lab.root / "state.db")
    try:
        conn.execute(
            'UPDATE steps SET output = \'{"n": NaN, "big": [Infinity, -Infinity, 1.5]}\' '
            "WHERE task_id = 't' AND idx = 0"
        )
        conn.commit()
    finally:
        conn.close()
    view = View(lab)
    try:
        code, kind, body = view.get("/api/tasks/t")
    finally:
        view.close()
    assert (code, kind) == (200, "application/json"), body

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    data = json.loads(body, parse_constant=refuse)
    assert data["outputs"]["0"] == {"n": None, "big": [None, None, 1.5]}
    assert data["steps"][0]["status"] == "done"


def test_the_page_number_takes_the_number_rule_of_the_options(sqlite_lab: Lab) -> None:
    # int() read "?page=%D9%A1" (an Arabic-Indic 1), "1_0" and " 1" as numbers:
    # the view served a page the command line's --from or --limit refuses.
    lab = sqlite_lab
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    view = View(lab)
    try:
        for page in ("%D9%A1", "1_0", "%201", "%EF%BC%91"):
            code, _, body = view.get(f"/api/tasks?page={page}")
            assert code == 400, (page, body)
        assert view.json("/api/tasks?page=0")["tasks"][0]["task"] == "t"
    finally:
        view.close()


def test_the_api_answers_its_errors_in_json(sqlite_lab: Lab) -> None:
    # A script reading /api/tasks/ID with a JSON parser got an HTML page for an
    # unknown task, a bad filter or a damaged task: "Expecting value", not why.
    lab = sqlite_lab
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    view = View(lab)
    try:
        for path, code, words in (
            ("/api/tasks/nope", 404, "unknown task 'nope'"),
            ("/api/tasks/..%2f..", 400, "invalid task id"),
            ("/api/tasks?status=nope", 400, "unknown status 'nope'"),
            ("/api/nothing", 404, "no page at /api/nothing"),
        ):
            got, kind, body = view.get(path)
            assert (got, kind) == (code, "application/json"), (path, body)
            assert json.loads(body) == {"error": json.loads(body)["error"], "status": code}
            assert words in json.loads(body)["error"], body
        # The pages a browser opens keep their HTML errors.
        got, kind, _ = view.get("/task/nope")
        assert (got, kind) == (404, "text/html; charset=utf-8")
    finally:
        view.close()
