"""ninelives beside its peers: the guide's 3-step task on DBOS, LangGraph and a minimal reference.

Every system runs the same tasks with the same tool code (``peertools.py``) in
its own fresh interpreter and database, one subprocess per system per round,
rounds interleaved (A B C ..., A B C ...) so that all share the machine's
noise; the table holds medians over rounds. Systems:

* ``minimal``: the guide's design written here in a few lines (its three
  tables, a commit before and after each tool, the task's ``done`` in the last
  step's commit): no locks, no fencing, no checks. The floor of the design.
* ``ninelives``: the library API (``ninelives.open``, ``create`` + ``run``).
* ``ninelives-workflow``: the same task as a workflow (``peertools.peer_summary``:
  two ``ctx.step`` calls and an ``@ninelives.step``), ``create`` + ``run``.
* ``ninelives-cli``: one ``ninelives create`` and one ``ninelives run`` process
  per task (at most ``--cli-tasks`` of them: it is dominated by start-up).
* ``langgraph-sync``: LangGraph, ``SqliteSaver`` on our own connection (WAL,
  ``synchronous=FULL``), ``durability="sync"``; ``langgraph-default``: its
  defaults (``SqliteSaver`` sets WAL itself, ``durability="async"``);
  ``langgraph-func``: its functional API, an ``@entrypoint`` calling three
  ``@task``s, on the same durable ``SqliteSaver``, ``durability="sync"``.
* ``dbos-wal``: DBOS's workflows (``@DBOS.workflow`` calling three ``@DBOS.step``s)
  with its SQLite system database, every connection set to
  WAL and ``synchronous=FULL`` by a SQLAlchemy ``connect`` listener;
  ``dbos-default``: its defaults (rollback journal).
* ``raw``: bare ``BEGIN IMMEDIATE; INSERT; COMMIT`` transactions, two per step.

Times cover the tasks only (imports, database set-up and DBOS's launch are
outside). CPU is the child's ``process_time`` plus its own children's. With
strace on the PATH, each system runs twice more under ``strace -f -c`` (with
the same tasks and with none) and the difference gives fdatasync, fsync,
pwrite64 and write per task. Every run is checked: each task done with its 3 steps,
one artifact per task holding the expected summary, no temporary file left.

    python bench/peers.py [--tasks 300] [--rounds 5] [--systems a,b] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import peertools  # noqa: E402

SYSTEMS = (
    "minimal",
    "ninelives",
    "ninelives-workflow",
    "ninelives-cli",
    "langgraph-sync",
    "langgraph-default",
    "langgraph-func",
    "dbos-wal",
    "dbos-default",
    "raw",
)
#: The module each system needs beyond ninelives and the standard library.
NEEDS = {
    "langgraph-sync": "langgraph.checkpoint.sqlite",
    "langgraph-default": "langgraph.checkpoint.sqlite",
    "langgraph-func": "langgraph.checkpoint.sqlite",
    "dbos-wal": "dbos",
    "dbos-default": "dbos",
}
#: The SQLite file each system writes, in its run's folder.
DATABASES = {
    "minimal": "minimal.db",
    "ninelives": "state.db",
    "ninelives-workflow": "state.db",
    "ninelives-cli": "state.db",
    "langgraph-sync": "langgraph.db",
    "langgraph-default": "langgraph.db",
    "langgraph-func": "langgraph.db",
    "dbos-wal": "dbos.sqlite",
    "dbos-default": "dbos.sqlite",
    "raw": "raw.db",
}
SYSCALLS = ("fdatasync", "fsync", "pwrite64", "write")


def installed(system: str) -> bool:
    """Whether the packages ``system`` needs are importable here."""
    import importlib.util

    module = NEEDS.get(system)
    if module is None:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def durable(conn: Any) -> None:
    """WAL and ``synchronous=FULL`` on a DB-API SQLite connection."""
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")


# -- the systems (each runs in a child, in its own folder) --------------------------


def run_minimal(n: int) -> tuple[Callable[[], None], Callable[[], dict[str, Any]]]:
    import sqlite3

    from ninelives.testing.lab import GUIDE_SCHEMA

    conn = sqlite3.connect("minimal.db", isolation_level=None)
    durable(conn)
    conn.executescript(GUIDE_SCHEMA)

    def event(task: str, kind: str, step: int | None) -> None:
        conn.execute(
            "INSERT INTO events (ts, task_id, run_id, kind, step_idx, data) VALUES (?,?,?,?,?,?)",
            (time.time(), task, "r", kind, step, "{}"),
        )

    def tool(idx: int, task: str, ctx: dict[int, Any]) -> Any:
        if idx == 0:
            return peertools.fetch(peertools.INPUT)
        if idx == 1:
            return peertools.summarize(ctx[0]["text"])
        return peertools.publish(peertools.ARTIFACTS, f"{task}.md", ctx[1]["summary"])

    def work() -> None:
        for i in range(n):
            task = f"t{i}"
            now = time.time()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "INSERT INTO tasks VALUES (?,?,?,?,?)", (task, "goal", "pending", now, now)
            )
            for idx, spec in enumerate(peertools.PLAN["steps"]):
                conn.execute(
                    "INSERT INTO steps (task_id, idx, tool, input) VALUES (?,?,?,?)",
                    (task, idx, spec["tool"], json.dumps(spec["input"])),
                )
            event(task, "task_created", None)
            conn.execute("COMMIT")
            ctx: dict[int, Any] = {}
            for idx in range(3):
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(
                    "UPDATE steps SET status='running', attempts=attempts+1 "
                    "WHERE task_id=? AND idx=?",
                    (task, idx),
                )
                event(task, "step_started", idx)
                conn.execute("COMMIT")
                ctx[idx] = tool(idx, task, ctx)
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(
                    "UPDATE steps SET status='done', output=? WHERE task_id=? AND idx=?",
                    (json.dumps(ctx[idx]), task, idx),
                )
                event(task, "step_finished", idx)
                if idx == 2:
                    conn.execute(
                        "UPDATE tasks SET status='done', updated_at=? WHERE id=?",
                        (time.time(), task),
                    )
                conn.execute("COMMIT")

    def check() -> dict[str, Any]:
        tasks = conn.execute("SELECT count(*) FROM tasks WHERE status='done'").fetchone()[0]
        steps = conn.execute("SELECT count(*) FROM steps WHERE status='done'").fetchone()[0]
        return {"tasks_done": tasks, "steps_done": steps}

    return work, check


def _ninelives_check(n: int) -> dict[str, Any]:
    import ninelives
    from ninelives.tools import Registry

    registry = Registry(entry_points=False)
    peertools.register(registry)
    tasks = steps = 0
    with ninelives.open("state.db", tools=registry) as rt:
        for i in range(n):
            task = rt.status(f"t{i}")
            tasks += task.status.value == "done"
            steps += sum(s.status.value == "done" for s in task.steps)
    return {"tasks_done": tasks, "steps_done": steps}


def run_ninelives(n: int) -> tuple[Callable[[], None], Callable[[], dict[str, Any]]]:
    import ninelives
    from ninelives.settings import Settings
    from ninelives.tools import Registry

    registry = Registry(entry_points=False)
    peertools.register(registry)
    settings = Settings(artifacts=peertools.ARTIFACTS)
    rt = ninelives.open("state.db", settings=settings, tools=registry)

    def work() -> None:
        for i in range(n):
            rt.create(f"t{i}", peertools.PLAN)
            rt.run(f"t{i}")
        rt.close()

    return work, lambda: _ninelives_check(n)


def run_ninelives_workflow(n: int) -> tuple[Callable[[], None], Callable[[], dict[str, Any]]]:
    import ninelives
    from ninelives.settings import Settings

    settings = Settings(artifacts=peertools.ARTIFACTS)
    rt = ninelives.open("state.db", settings=settings)

    def work() -> None:
        for i in range(n):
            rt.create(f"t{i}", peertools.peer_summary, peertools.INPUT)
            rt.run(f"t{i}")
        rt.close()

    return work, lambda: _ninelives_check(n)


def run_ninelives_cli(n: int) -> tuple[Callable[[], None], Callable[[], dict[str, Any]]]:
    from ninelives.testing.lab import cli_command

    Path("plan.json").write_text(json.dumps(peertools.PLAN))
    env = dict(os.environ, PYTHONPATH=str(HERE), AGENT_ARTIFACTS=peertools.ARTIFACTS)
    base = [*cli_command(), "--db", "state.db", "--tools", "peertools"]

    def work() -> None:
        for i in range(n):
            for args in (["create", f"t{i}", "plan.json"], ["run", f"t{i}", "-q"]):
                subprocess.run([*base, *args], check=True, env=env, stdout=subprocess.DEVNULL)

    return work, lambda: _ninelives_check(n)


def run_langgraph(n: int, sync: bool) -> tuple[Callable[[], None], Callable[[], dict[str, Any]]]:
    import sqlite3
    from typing import TypedDict

    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    class State(TypedDict, total=False):
        task: str
        fetched: dict[str, Any]
        summary: dict[str, Any]
        published: dict[str, Any]

    def fetch(state: State) -> State:
        return {"fetched": peertools.fetch(peertools.INPUT)}

    def summarize(state: State) -> State:
        return {"summary": peertools.summarize(state["fetched"]["text"])}

    def publish(state: State) -> State:
        name = f"{state['task']}.md"
        return {
            "published": peertools.publish(peertools.ARTIFACTS, name, state["summary"]["summary"])
        }

    builder = StateGraph(State)
    builder.add_node("fetch", fetch)
    builder.add_node("summarize", summarize)
    builder.add_node("publish", publish)
    builder.add_edge(START, "fetch")
    builder.add_edge("fetch", "summarize")
    builder.add_edge("summarize", "publish")
    builder.add_edge("publish", END)
    conn = sqlite3.connect("langgraph.db", check_same_thread=False)
    if sync:
        durable(conn)
    saver = SqliteSaver(conn)
    saver.setup()
    graph = builder.compile(checkpointer=saver)
    extra: dict[str, Any] = {"durability": "sync"} if sync else {}

    def work() -> None:
        for i in range(n):
            config = {"configurable": {"thread_id": f"t{i}"}}
            graph.invoke({"task": f"t{i}"}, config, **extra)  # type: ignore[arg-type]

    def check() -> dict[str, Any]:
        tasks = steps = 0
        for i in range(n):
            snapshot = graph.get_state({"configurable": {"thread_id": f"t{i}"}})
            values = snapshot.values
            done = [k for k in ("fetched", "summary", "published") if k in values]
            steps += len(done)
            tasks += len(done) == 3 and not snapshot.next
        return {"tasks_done": tasks, "steps_done": steps}

    return work, check


def run_langgraph_func(n: int) -> tuple[Callable[[], None], Callable[[], dict[str, Any]]]:
    """LangGraph's functional API: an ``@entrypoint`` calling three ``@task``s."""
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.func import entrypoint, task

    @task
    def fetch(path: str) -> dict[str, Any]:
        return peertools.fetch(path)

    @task
    def summarize(text: str) -> dict[str, Any]:
        return peertools.summarize(text)

    @task
    def publish(name: str, text: str) -> dict[str, Any]:
        return peertools.publish(peertools.ARTIFACTS, name, text)

    conn = sqlite3.connect("langgraph.db", check_same_thread=False)
    durable(conn)
    saver = SqliteSaver(conn)
    saver.setup()

    @entrypoint(checkpointer=saver)
    def workflow(task_id: str) -> dict[str, Any]:
        fetched = fetch(peertools.INPUT).result()
        summary = summarize(fetched["text"]).result()
        return publish(f"{task_id}.md", summary["summary"]).result()

    def work() -> None:
        for i in range(n):
            config = {"configurable": {"thread_id": f"t{i}"}}
            workflow.invoke(f"t{i}", config, durability="sync")  # type: ignore[arg-type]

    def check() -> dict[str, Any]:
        tasks = steps = 0
        for i in range(n):
            config = {"configurable": {"thread_id": f"t{i}"}}
            snapshot = workflow.get_state(config)  # type: ignore[arg-type]
            done = isinstance(snapshot.values, dict) and "path" in snapshot.values
            tasks += done and not snapshot.next
            # Each finished @task is a "__return__" write of the run's checkpoints.
            steps += sum(
                channel == "__return__"
                for saved in saver.list(config)  # type: ignore[arg-type]
                for _, channel, _ in saved.pending_writes or ()
            )
        return {"tasks_done": tasks, "steps_done": steps}

    return work, check


def run_dbos(n: int, wal: bool) -> tuple[Callable[[], None], Callable[[], dict[str, Any]]]:
    import logging

    if wal:
        import sqlalchemy

        # Every SQLite connection of this process (DBOS's pool included) opens
        # with WAL and synchronous=FULL; DBOS's own listener runs too.
        @sqlalchemy.event.listens_for(sqlalchemy.engine.Engine, "connect")
        def _pragmas(dbapi_conn: Any, record: Any) -> None:
            durable(dbapi_conn)

    from dbos import DBOS, SetWorkflowID

    logging.getLogger("dbos").setLevel(logging.WARNING)
    url = f"sqlite:///{Path('dbos.sqlite').resolve()}"
    DBOS(config={"name": "peers", "system_database_url": url, "log_level": "WARNING"})

    @DBOS.step()
    def fetch(path: str) -> dict[str, Any]:
        return peertools.fetch(path)

    @DBOS.step()
    def summarize(text: str) -> dict[str, Any]:
        return peertools.summarize(text)

    @DBOS.step()
    def publish(name: str, text: str) -> dict[str, Any]:
        return peertools.publish(peertools.ARTIFACTS, name, text)

    @DBOS.workflow()
    def task(task_id: str) -> dict[str, Any]:
        fetched = fetch(peertools.INPUT)
        summary = summarize(fetched["text"])
        return publish(f"{task_id}.md", summary["summary"])

    DBOS.launch()

    def work() -> None:
        for i in range(n):
            with SetWorkflowID(f"t{i}"):
                task(f"t{i}")

    def check() -> dict[str, Any]:
        tasks = steps = 0
        for i in range(n):
            status = DBOS.get_workflow_status(f"t{i}")
            tasks += status is not None and status.status == "SUCCESS"
            steps += len(DBOS.list_workflow_steps(f"t{i}"))
        DBOS.destroy()
        return {"tasks_done": tasks, "steps_done": steps}

    return work, check


def run_raw(n: int) -> tuple[Callable[[], None], Callable[[], dict[str, Any]]]:
    import sqlite3

    from step_overhead import time_raw_commits

    def work() -> None:
        time_raw_commits(Path("."), 6 * n)  # two commits per step, three steps per task

    def check() -> dict[str, Any]:
        conn = sqlite3.connect("raw.db")
        rows = conn.execute("SELECT count(*) FROM t").fetchone()[0]
        conn.close()
        return {"tasks_done": rows // 6, "steps_done": rows // 2}

    return work, check


RUNNERS: dict[str, Callable[[int], tuple[Callable[[], None], Callable[[], dict[str, Any]]]]] = {
    "minimal": run_minimal,
    "ninelives": run_ninelives,
    "ninelives-workflow": run_ninelives_workflow,
    "ninelives-cli": run_ninelives_cli,
    "langgraph-sync": lambda n: run_langgraph(n, True),
    "langgraph-default": lambda n: run_langgraph(n, False),
    "langgraph-func": run_langgraph_func,
    "dbos-wal": lambda n: run_dbos(n, True),
    "dbos-default": lambda n: run_dbos(n, False),
    "raw": run_raw,
}


def journal_mode(path: str) -> str:
    """The journal mode stored in a SQLite file (WAL persists; the rollback modes read as
    ``delete``)."""
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        conn.close()


def child(system: str, n: int) -> int:
    """Run ``n`` tasks of ``system`` in the working directory; one JSON line on stdout."""
    import resource

    os.makedirs("input", exist_ok=True)
    os.makedirs(peertools.ARTIFACTS, exist_ok=True)
    Path(peertools.INPUT).write_text(peertools.NOTES)
    work, check = RUNNERS[system](n)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0 = time.process_time() + kids.ru_utime + kids.ru_stime
    t0 = time.perf_counter()
    work()
    wall = time.perf_counter() - t0
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = time.process_time() + kids.ru_utime + kids.ru_stime - cpu0
    result = {"system": system, "tasks": n, "wall": wall, "cpu": cpu, **check()}
    result["calls"] = dict(peertools.CALLS)
    result["journal_mode"] = journal_mode(DATABASES[system])
    print(json.dumps(result), flush=True)
    return 0


# -- the parent ----------------------------------------------------------------------


def check_artifacts(folder: Path, system: str, n: int) -> list[str]:
    """What is wrong with one finished run (empty when every task is right)."""
    if system == "raw":
        return []
    problems = []
    files = sorted((folder / peertools.ARTIFACTS).iterdir())
    tmp = [f.name for f in files if f.name.endswith(".tmp")]
    published = [f for f in files if f.name.endswith(".md")]
    if tmp:
        problems.append(f"temporary files left: {tmp}")
    if len(published) != n:
        problems.append(f"{len(published)} artifacts for {n} tasks")
    wrong = [f.name for f in published if f.read_text() != peertools.SUMMARY]
    if wrong:
        problems.append(f"artifacts with the wrong content: {wrong[:3]}")
    return problems


def spawn(system: str, n: int, root: Path, strace_out: Path | None = None) -> dict[str, Any]:
    """One child run of ``system`` in a fresh folder; its result, checked."""
    folder = Path(tempfile.mkdtemp(prefix=f"{system}-", dir=root))
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", system, "--tasks", str(n)]
    if strace_out is not None:
        argv = ["strace", "-f", "-c", "-o", str(strace_out), "-e", "trace=" + ",".join(SYSCALLS)]
        argv += [sys.executable, str(Path(__file__).resolve()), "--child", system]
        argv += ["--tasks", str(n)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "NINELIVES_"))}
    env["DBOS__CLOUD"] = "false"
    proc = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"peers: {system} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    problems = check_artifacts(folder, system, n)
    if result["tasks_done"] != n or result["steps_done"] != 3 * n:
        problems.append(f"{result['tasks_done']} tasks and {result['steps_done']} steps done")
    calls = result["calls"]
    if system not in ("raw", "ninelives-cli") and set(calls.values()) != {n}:
        problems.append(f"tool calls {calls} for {n} tasks")
    result["problems"] = problems
    shutil.rmtree(folder, ignore_errors=True)
    return result


def parse_strace(path: Path) -> dict[str, int]:
    """Calls per syscall from the summary table of ``strace -c``."""
    counts = dict.fromkeys(SYSCALLS, 0)
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[-1] in counts and fields[3].isdigit():
            counts[fields[-1]] = int(fields[3])
    return counts


def syscalls_per_task(system: str, n: int, root: Path) -> dict[str, float]:
    """fdatasync, fsync, pwrite64 and write per task: a run of ``n`` tasks minus a run of none."""
    full, empty = root / f"{system}.strace", root / f"{system}.0.strace"
    spawn(system, n, root, full)
    spawn(system, 0, root, empty)
    a, b = parse_strace(full), parse_strace(empty)
    return {k: (a[k] - b[k]) / n for k in SYSCALLS}


def measure(
    systems: list[str], tasks: int, rounds: int, cli_tasks: int, folder: str | None = None
) -> dict[str, Any]:
    """Interleaved rounds, then strace passes; per-system medians and ratios."""

    def count(system: str) -> int:
        return min(tasks, cli_tasks) if system == "ninelives-cli" else tasks

    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    with tempfile.TemporaryDirectory(prefix="peers-", dir=folder) as tmp:
        root = Path(tmp)
        for _ in range(rounds):
            for system in systems:
                runs[system].append(spawn(system, count(system), root))
        traced = shutil.which("strace") is not None
        sys_counts = {s: syscalls_per_task(s, count(s), root) for s in systems} if traced else {}
    rows: dict[str, dict[str, Any]] = {}
    for system in systems:
        n = count(system)
        rate = statistics.median(n / r["wall"] for r in runs[system])
        cpu = statistics.median(r["cpu"] / n for r in runs[system])
        step = statistics.median(r["wall"] / (3 * n) for r in runs[system])
        problems = sorted({p for r in runs[system] for p in r["problems"]})
        rows[system] = {
            "tasks": n,
            "tasks_per_s": rate,
            "cpu_ms_per_task": cpu * 1e3,
            "step_ms": step * 1e3,
            "syscalls_per_task": sys_counts.get(system),
            "journal_mode": runs[system][0]["journal_mode"],
            "ok": not problems,
            "problems": problems,
        }
    if "raw" in rows:
        floor = rows["raw"]["step_ms"]
        for row in rows.values():
            row["step_vs_raw"] = row["step_ms"] / floor
    return {
        "tasks": tasks,
        "rounds": rounds,
        "systems": rows,
        "ninelives_vs": versus(rows, "ninelives", PLAN_PEERS),
        "workflow_vs": versus(rows, "ninelives-workflow", WORKFLOW_PEERS),
    }


#: What the plan row and the workflow row are compared with, in this order.
PLAN_PEERS = ("minimal", "langgraph-sync", "dbos-wal", "langgraph-default", "dbos-default")
WORKFLOW_PEERS = ("ninelives", "dbos-wal", "langgraph-func", "dbos-default", "langgraph-sync")


def versus(
    rows: dict[str, dict[str, Any]], ours: str, peers: tuple[str, ...]
) -> dict[str, dict[str, float]]:
    """The ratios of row ``ours`` to each of ``peers`` that ran (none when ``ours`` did not)."""
    if ours not in rows:
        return {}
    mine = rows[ours]
    return {
        peer: {
            "tasks_per_s": mine["tasks_per_s"] / rows[peer]["tasks_per_s"],
            "cpu_ms_per_task": mine["cpu_ms_per_task"] / rows[peer]["cpu_ms_per_task"],
        }
        for peer in peers
        if peer in rows
    }


def versions() -> dict[str, str]:
    """Python, SQLite and the version of each system's package installed here."""
    import sqlite3
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": sys.version.split()[0], "sqlite": sqlite3.sqlite_version}
    conn = sqlite3.connect(":memory:")
    # What a connection that sets nothing gets (0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA).
    found["sqlite_default_synchronous"] = str(conn.execute("PRAGMA synchronous").fetchone()[0])
    conn.close()
    for name in ("ninelives", "langgraph", "langgraph-checkpoint-sqlite", "dbos", "sqlalchemy"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


def table(result: dict[str, Any]) -> str:
    """The results as a Markdown table, then the ratios."""
    lines = [
        "| system | journal | tasks/s | CPU ms/task | ms/step | vs 2 raw commits "
        "| fdatasync/task | fsync/task | pwrite64/task | write/task | checked |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for system, row in result["systems"].items():
        sc = row["syscalls_per_task"]
        counts = [f"{sc[k]:.1f}" for k in SYSCALLS] if sc else ["-"] * len(SYSCALLS)
        vs = f"{row['step_vs_raw']:.2f}x" if "step_vs_raw" in row else "-"
        checked = "ok" if row["ok"] else "FAILED: " + "; ".join(row["problems"])
        lines.append(
            f"| {system} | {row['journal_mode']} | {row['tasks_per_s']:.0f} "
            f"| {row['cpu_ms_per_task']:.2f} "
            f"| {row['step_ms']:.3f} | {vs} | {' | '.join(counts)} | {checked} |"
        )
    for key, title in (("ninelives_vs", "ninelives"), ("workflow_vs", "ninelives-workflow")):
        if result.get(key):
            lines += ["", f"| {title} vs | tasks/s | CPU ms/task |", "| --- | ---: | ---: |"]
            for peer, ratio in result[key].items():
                lines.append(
                    f"| {peer} | {ratio['tasks_per_s']:.2f}x | {ratio['cpu_ms_per_task']:.2f}x |"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=300, help="tasks per round (default 300)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument(
        "--cli-tasks", type=int, default=50, help="tasks per round of ninelives-cli (default 50)"
    )
    parser.add_argument(
        "--systems", help=f"comma-separated, in this order by default: {','.join(SYSTEMS)}"
    )
    parser.add_argument("--dir", help="folder for the runs' databases (default: the temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args.tasks)
    if args.tasks < 1 or args.rounds < 1 or args.cli_tasks < 1:
        parser.error("--tasks, --rounds and --cli-tasks must be at least 1")
    wanted = args.systems.split(",") if args.systems else list(SYSTEMS)
    unknown = [s for s in wanted if s not in SYSTEMS]
    if unknown:
        parser.error(f"unknown system(s) {unknown}; choose from {', '.join(SYSTEMS)}")
    systems = [s for s in wanted if installed(s)]
    missing = [s for s in wanted if s not in systems]
    if missing:
        print(f"peers: not installed, left out: {', '.join(missing)}", file=sys.stderr)
    result = measure(systems, args.tasks, args.rounds, args.cli_tasks, args.dir)
    result["versions"] = versions()
    result["left_out"] = missing
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.tasks} tasks x {args.rounds} interleaved rounds, medians")
        print(table(result))
    return 0 if all(row["ok"] for row in result["systems"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
