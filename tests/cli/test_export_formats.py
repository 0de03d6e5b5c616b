"""``export --format csv|otlp-json``: the journal as CSV rows and as an OpenTelemetry trace.

The OTLP/JSON output is parsed by the official ``opentelemetry-proto`` package
into an ``ExportTraceServiceRequest``: what Jaeger, Tempo and Honeycomb ingest.
"""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ninelives.testing import Lab


def _killed_twice(lab: Lab) -> None:
    """The guide's task, killed after step 1's effect and before step 2's, then resumed."""
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    assert lab.cli("run", "t", AGENT_CRASH_AT="after_effect:1").returncode == -9
    assert lab.cli("run", "t", AGENT_CRASH_AT="before_effect:2").returncode == -9
    assert lab.cli("run", "t").returncode == 0


def _parse_otlp(text: str) -> tuple[dict[str, Any], ExportTraceServiceRequest]:
    """The export as JSON, and as the protobuf message. OTLP/JSON writes ids in hex
    where the proto3 JSON mapping expects base64: convert them, as collectors do."""
    import base64

    data = json.loads(text)
    mapped = json.loads(text)
    for span in mapped["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        for key in ("traceId", "spanId", "parentSpanId"):
            if key in span:
                span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    request = json_format.Parse(json.dumps(mapped), ExportTraceServiceRequest())
    return data, request


def test_otlp_export_is_one_trace_with_a_span_per_run_and_attempt(lab: Lab) -> None:
    _killed_twice(lab)
    exported = lab.cli("export", "t", "--format", "otlp-json")
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout.count("\n") == 1  # one JSON document, one line
    data, request = _parse_otlp(exported.stdout)
    spans = list(request.resource_spans[0].scope_spans[0].spans)
    by_name = {s.name: s for s in spans}
    trace_ids = {s.trace_id for s in spans}
    assert len(trace_ids) == 1
    assert len(next(iter(trace_ids))) == 16
    assert all(len(s.span_id) == 8 for s in spans)
    assert len({s.span_id for s in spans}) == len(spans)
    root = by_name["task t"]
    assert root.parent_span_id == b""
    assert root.status.code == 1
    assert {"create", "run 1", "run 2", "run 3"} <= set(by_name)
    runs = [by_name[f"run {n}"] for n in (1, 2, 3)]
    assert all(r.parent_span_id == root.span_id for r in runs)
    # Each attempt is a child of its run; the two killed attempts end in error.
    attempts = [s for s in spans if s.name.startswith("step ")]
    assert sorted(s.name for s in attempts) == [
        "step 0 fetch", "step 1 summarize", "step 1 summarize",
        "step 2 write_artifact", "step 2 write_artifact",
    ]  # fmt: skip
    run_ids = {r.span_id for r in runs}
    assert all(s.parent_span_id in run_ids for s in attempts)
    killed = [s for s in attempts if s.status.code == 2]
    assert [(s.name, s.parent_span_id) for s in killed] == [
        ("step 1 summarize", runs[0].span_id),
        ("step 2 write_artifact", runs[1].span_id),
    ]
    assert all("killed" in s.status.message for s in killed)
    # Each recovery is an event on the run that found it.
    recovered = [(r.name, e.name) for r in runs for e in r.events if e.name == "step_recovered"]
    assert recovered == [("run 2", "step_recovered"), ("run 3", "step_recovered")]
    # Ids in hex, as OTLP/JSON requires; a second export gives the same ids.
    again = json.loads(lab.cli("export", "t", "--format", "otlp-json").stdout)
    assert again == data
    first = data["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert bytes.fromhex(first["traceId"]) == spans[0].trace_id


def test_otlp_export_times_are_the_journals(lab: Lab) -> None:
    _killed_twice(lab)
    events = lab.cli("export", "t").jsonl()
    _, request = _parse_otlp(lab.cli("export", "t", "--format", "otlp-json").stdout)
    spans = list(request.resource_spans[0].scope_spans[0].spans)
    root = next(s for s in spans if s.name == "task t")
    assert root.start_time_unix_nano == round(events[0]["ts"] * 1e9)
    assert root.end_time_unix_nano == round(events[-1]["ts"] * 1e9)
    assert all(s.start_time_unix_nano <= s.end_time_unix_nano for s in spans)


def test_csv_export_has_a_row_per_event_with_its_data(lab: Lab) -> None:
    _killed_twice(lab)
    events = lab.cli("export", "t").jsonl()
    exported = lab.cli("export", "t", "--format", "csv")
    assert exported.returncode == 0, exported.stderr
    rows = list(csv.DictReader(io.StringIO(exported.stdout)))
    assert len(rows) == len(events)
    for row, event in zip(rows, events, strict=True):
        assert int(row["seq"]) == event["seq"]
        assert float(row["ts"]) == event["ts"]
        assert row["kind"] == event["kind"]
        assert row["step"] == ("" if event["step"] is None else str(event["step"]))
        fixed = {"seq", "ts", "run", "kind", "step"}
        assert json.loads(row["data"]) == {k: v for k, v in event.items() if k not in fixed}


def test_a_hostile_goal_is_data_in_every_format(lab: Lab) -> None:
    goal = 'x",\n<script>alert(1)</script>\r\n=cmd|"/c calc"!A1'
    lab.write("notes.txt", "n\n")
    lab.write_plan({"goal": goal, "steps": [{"tool": "fetch", "input": {"path": "notes.txt"}}]})
    assert lab.cli("create", "t", "plan.json").returncode == 0
    assert lab.cli("run", "t").returncode == 0
    _, request = _parse_otlp(lab.cli("export", "t", "--format", "otlp-json").stdout)
    root = request.resource_spans[0].scope_spans[0].spans[0]
    assert {a.key: a.value.string_value for a in root.attributes}["ninelives.goal"] == goal
    assert len(list(csv.DictReader(io.StringIO(lab.cli("export", "t", "--format", "csv").stdout))))


def test_an_unknown_format_is_bad_input(lab: Lab) -> None:
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    refused = lab.cli("export", "t", "--format", "xml")
    assert refused.returncode == 4
    assert refused.stderr.count("\n") == 1
    assert "invalid choice" in refused.stderr
    assert lab.cli("export", "nope", "--format", "otlp-json").returncode == 1


def test_the_documented_pipeline_posts_the_trace_to_an_otlp_http_receiver(lab: Lab) -> None:
    # The block of docs/guides/observing.md (Traces), against a real HTTP receiver on
    # 127.0.0.1 in place of a collector.
    import http.server
    import shlex
    import shutil
    import subprocess
    import threading

    received: list[tuple[str, str, bytes]] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, self.headers["Content-Type"], body))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _killed_twice(lab)
        curl = shutil.which("curl")
        assert curl is not None, "curl is needed to run the docs' pipeline"
        port = server.server_address[1]
        pipeline = (
            f"{shlex.join(lab.argv(['export', 't', '--format', 'otlp-json']))} | {curl} -sS "
            "-H 'Content-Type: application/json' --data-binary @- "
            f"http://127.0.0.1:{port}/v1/traces"
        )
        posted = subprocess.run(
            pipeline, shell=True, cwd=lab.root, env=lab.env(), capture_output=True,
            text=True, timeout=60, check=False,
        )  # fmt: skip
        assert posted.returncode == 0, posted.stderr
    finally:
        server.shutdown()
        server.server_close()
    [(path, content_type, body)] = received
    assert (path, content_type) == ("/v1/traces", "application/json")
    _, request = _parse_otlp(body.decode())
    assert len(request.resource_spans[0].scope_spans[0].spans) == 10


def test_an_integer_past_int64_in_the_journal_is_a_string_attribute(lab: Lab) -> None:
    # A workflow's result is any JSON value, an integer of any size among them;
    # OTLP's intValue is an int64, which a collector refuses to parse past
    # its range (the whole trace with it). Such a number is given as text.
    lab.write(
        "wf.py",
        "import ninelives\n\n\n"
        '@ninelives.workflow("big")\n'
        "def big(ctx, n):\n"
        '    return ctx.step("calc", lambda: n) * 10**30\n',
    )
    created = lab.cli("--tools", "wf", "create", "w", "--workflow", "big", "--args", "[3]")
    assert created.returncode == 0, created.stderr
    assert lab.cli("--tools", "wf", "run", "w").returncode == 0
    exported = lab.cli("export", "w", "--format", "otlp-json")
    assert exported.returncode == 0, exported.stderr
    data, request = _parse_otlp(exported.stdout)
    spans = data["resourceSpans"][0]["scopeSpans"][0]["spans"]
    done = [e for s in spans for e in s.get("events", []) if e["name"] == "task_done"]
    assert len(done) == 1
    result = {a["key"]: a["value"] for a in done[0]["attributes"]}["ninelives.result"]
    assert result == {"stringValue": str(3 * 10**30)}
    assert len(request.resource_spans[0].scope_spans[0].spans) == len(spans)


def test_csv_data_is_strict_json_for_an_event_an_older_version_stored_with_nan(
    sqlite_lab: Lab,
) -> None:
    # The data column is JSON: a NaN or an infinity of an older version's row
    # (or a hand edit) is null there, as in the JSON Lines export.
    lab = sqlite_lab
    _killed_twice(lab)
    conn = sqlite3.connect(lab.root / "state.db")
    try:
        conn.execute(
            'UPDATE events SET data = \'{"tool": "fetch", "x": NaN, "y": [-Infinity]}\' '
            "WHERE kind = 'step_finished' AND step_idx = 0"
        )
        conn.commit()
    finally:
        conn.close()
    exported = lab.cli("export", "t", "--format", "csv")
    assert exported.returncode == 0, exported.stderr

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    rows = list(csv.DictReader(io.StringIO(exported.stdout)))
    data = [json.loads(row["data"], parse_constant=refuse) for row in rows]
    assert {"tool": "fetch", "x": None, "y": [None]} in data
    jsonl = [e for e in lab.cli("export", "t").jsonl() if e["kind"] == "step_finished"]
    assert {"x": None, "y": [None]}.items() <= jsonl[0].items()
