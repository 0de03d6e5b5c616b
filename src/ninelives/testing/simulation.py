"""A seeded, deterministic crash simulation that runs thousands of seeds in minutes.

Each seed builds a random plan of fake tools (a fake LLM, a fake clock, a
fake outside service, and real file publishing), then runs it in this
process with a real :class:`~ninelives.runtime.Runtime` on a real SQLite file.
At every named crash point (:mod:`ninelives.crashpoints`) a seeded coin decides
whether the "process" dies there: the handler raises :class:`SimulatedCrash`,
the store is abandoned (its connection closed and its task lock released, as
the kernel does for a killed process) and a fresh runtime opens the same file
and carries on. Tool failures are seeded too. After each seed the run is
checked: :mod:`ninelives.verify` on the task, its journal and its artifacts;
committed outputs never lost or changed; each effect delivered once; outputs
equal to what the deterministic tools compute.

Everything a seed does follows from the seed, so a failing seed replays
exactly: ``run_seed(seed, folder)``. One difference from a real kill: an
exception unwinds ``finally`` blocks that a SIGKILL would skip (a temporary
file is removed rather than left behind); the real-process suite covers those.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import sqlite3
import time
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import crashpoints
from ..errors import TaskFailed, ToolError
from ..journal import dumps
from ..models import Event, EventKind, StepStatus, Task, TaskStatus, load_json_object

if TYPE_CHECKING:
    from ..settings import Settings
    from ..tools import ToolContext

TASK_ID = "sim"
#: Crash points a simulation cannot reach, with the reason (none today).
NOT_SIMULATED: dict[str, str] = {
    # The simulated plans have no probe or approval steps; tests/crash/test_unknown.py
    # and tests/crash/test_approval.py kill real processes at these points.
    "probe_answered": "no probe tool in the simulated plans",
    "settle_before_commit": "no probe tool in the simulated plans",
    "decision_before_commit": "no person deciding in the simulated plans",
    "gc_before_commit": "gc deletes finished tasks and runs no step: killed for real, on both "
    "stores, by tests/crash/test_crashpoints.py and tests/crash/test_gc_kills.py",
}
#: Planted bugs for negative controls.
#: ``unsafe_effect``: the fake outside service ignores idempotency keys.
#: ``silent_reset``: after each crash, steps left ``running`` are put back to
#: ``pending`` with no ``step_recovered``, as a runtime that skips explicit
#: recovery would.
BUGS = ("unsafe_effect", "silent_reset")


class SimulatedCrash(BaseException):
    """The simulated process dies here. A BaseException: ``except Exception``
    in tools or the runtime does not catch it, as nothing catches SIGKILL."""

    def __init__(self, point: str, step: int | None) -> None:
        super().__init__(f"simulated crash at {point}" + ("" if step is None else f":{step}"))
        self.point = point
        self.step = step


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    """The knobs of a simulation. ``bug`` plants a known bug (see :data:`BUGS`).

    Each seed's tools fail with a chance of 0, ``tool_failure_rate`` or five
    times it (drawn by the seed), so both smooth runs and tasks that use up
    their ``max_attempts`` are common.
    """

    crash_rate: float = 0.15
    max_crashes: int = 6
    tool_failure_rate: float = 0.1
    max_attempts: int = 3
    max_steps: int = 6
    legacy_rate: float = 0.2
    #: Share of seeds that store every output as a blob (``blob_threshold=0``).
    blob_rate: float = 0.3
    bug: str | None = None


@dataclass(frozen=True, kw_only=True)
class SeedResult:
    """What one seed did and whether its checks held."""

    seed: int
    problems: tuple[str, ...]
    status: str
    steps: int
    incarnations: int
    crashes: tuple[str, ...]
    recoveries: int
    tool_failures: int
    duplicates: int
    lost_commits: int

    @property
    def ok(self) -> bool:
        """True when every check held."""
        return not self.problems


@dataclass(frozen=True, kw_only=True)
class SimReport:
    """Totals over many seeds; ``failures`` holds every seed whose checks failed."""

    seeds_run: int
    failures: tuple[SeedResult, ...]
    crashes: int
    points: dict[str, int]
    recoveries: int
    tool_failures: int
    duplicates: int
    lost_commits: int
    done: int
    failed: int
    elapsed: float

    @property
    def ok(self) -> bool:
        """True when no seed failed."""
        return not self.failures


@dataclass
class World:
    """The outside world the fake tools touch; it outlives every simulated process."""

    now: float = 0.0
    delivered: dict[str, list[str]] = field(default_factory=dict)

    def sleep(self, seconds: float) -> None:
        """The fake clock: time passes instantly."""
        self.now += seconds


def llm_reply(prompt: str) -> str:
    """The fake LLM's answer: a deterministic function of the prompt."""
    lines = [line.strip() for line in prompt.splitlines() if line.strip()][:2]
    return " / ".join(lines) + f" #{zlib.crc32(prompt.encode()):08x}"


def _text_of(output: Any) -> str:
    if isinstance(output, Mapping):
        for key in ("text", "summary"):
            if isinstance(output.get(key), str):
                return str(output[key])
    raise ToolError("source step has no text")


def _source(step_input: Mapping[str, Any], ctx: Mapping[int, Any]) -> str:
    ref = step_input.get("from")
    if not isinstance(ref, int) or ref not in ctx:
        raise ToolError(f"step {ref} has no committed output")
    return _text_of(ctx[ref])


def sim_registry(world: World, rng: random.Random, config: SimConfig, artifacts: str) -> Any:
    """The fake tools, registered through the ordinary :class:`~ninelives.tools.Registry`."""
    from ..tools import Registry, Tool
    from ..tools.effects import publish_once

    tools = Registry(entry_points=False)

    def flaky(what: str) -> None:
        if rng.random() < config.tool_failure_rate:
            raise ToolError(f"{what}: simulated outage")

    def sim_read(step_input: Mapping[str, Any], ctx: Mapping[int, Any], key: str) -> Any:
        return {"text": step_input["text"]}

    def sim_llm(step_input: Mapping[str, Any], ctx: Mapping[int, Any], key: str) -> Any:
        prompt = _source(step_input, ctx)
        world.sleep(0.5 + len(prompt) / 1000)
        flaky("llm")
        return {"summary": llm_reply(prompt), "engine": "fake"}

    def sim_wait(step_input: Mapping[str, Any], context: ToolContext) -> Any:
        # Waits in two halves with a checkpoint between: a resumed attempt skips
        # the half its progress says is done.
        seconds = float(step_input["seconds"])
        if context.progress is None:
            world.sleep(seconds / 2)
            context.checkpoint({"half": True})
        world.sleep(seconds / 2)
        return {"waited": step_input["seconds"], "at": world.now}

    def sim_send(step_input: Mapping[str, Any], ctx: Mapping[int, Any], key: str) -> Any:
        body = _source(step_input, ctx)
        flaky("send")
        inbox = world.delivered.setdefault(key, [])
        # The outside service deduplicates by idempotency key; the planted bug
        # ignores the key, as a service without idempotency would.
        fresh = not inbox or config.bug == "unsafe_effect"
        if fresh:
            inbox.append(body)
        return {"message_id": key, "deduplicated": not fresh}

    def sim_publish(step_input: Mapping[str, Any], ctx: Mapping[int, Any], key: str) -> Any:
        body = _source(step_input, ctx).encode()
        step = int(key.rpartition("-")[2])
        done = publish_once(artifacts, f"{key}.md", body, step=step)
        return {
            "path": done.path,
            "deduplicated": done.deduplicated,
            "sha256": done.sha256,
            "bytes": done.size,
        }

    for tool in (sim_read, sim_llm, sim_send, sim_publish):
        tools.register(tool.__name__, tool)
    tools.add(Tool(name="sim_wait", fn=sim_wait, takes_context=True))
    return tools


PURE_TOOLS = ("sim_read", "sim_llm")


def make_plan(rng: random.Random, max_steps: int) -> dict[str, Any]:
    """A random plan: a read first, then LLM calls, waits, sends and publishes."""
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
    text = "\n".join(" ".join(rng.choice(words) for _ in range(3)) for _ in range(4))
    steps: list[dict[str, Any]] = [{"tool": "sim_read", "input": {"text": text}}]
    sources = [0]
    for idx in range(1, rng.randint(1, max_steps)):
        tool = rng.choice(["sim_llm", "sim_llm", "sim_wait", "sim_send", "sim_publish"])
        if tool == "sim_wait":
            steps.append({"tool": tool, "input": {"seconds": rng.choice([1, 5, 30])}})
            continue
        steps.append({"tool": tool, "input": {"from": rng.choice(sources)}})
        if tool == "sim_llm":
            sources.append(idx)
    return {"goal": "simulated task", "steps": steps}


def expected_output(tool: str, step_input: Mapping[str, Any], ctx: Mapping[int, Any]) -> Any:
    """What a deterministic fake tool commits (None: the output varies by design)."""
    if tool == "sim_read":
        return {"text": step_input["text"]}
    if tool == "sim_llm":
        return {"summary": llm_reply(_source(step_input, ctx)), "engine": "fake"}
    return None


def write_legacy_database(
    path: str, plan: Mapping[str, Any], outputs: Mapping[int, Any], *, task_id: str = TASK_ID
) -> None:
    """A database as the guide's own code leaves it: the contract's three tables
    only (``user_version`` 0) and one task whose steps ``0..len(outputs)-1`` were
    committed ``done`` with ``outputs`` by a run that then died."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        for statement in LEGACY_SCHEMA:
            conn.execute(statement)
        now, run = time.time(), "0" * 32
        conn.execute("BEGIN")
        conn.execute(
            "INSERT INTO tasks (id, goal, status, created_at, updated_at) VALUES (?,?,?,?,?)",
            (task_id, plan["goal"], "running" if outputs else "pending", now, now),
        )

        def event(kind: str, step: int | None, data: dict[str, Any]) -> None:
            conn.execute(
                "INSERT INTO events (ts, task_id, run_id, kind, step_idx, data) "
                "VALUES (?,?,?,?,?,?)",
                (now, task_id, run, kind, step, dumps(data)),
            )

        event("task_created", None, {"steps": len(plan["steps"])})
        if outputs:
            event("run_started", None, {"recovered": []})
        for idx, step in enumerate(plan["steps"]):
            done = idx in outputs
            if done:
                event("step_started", idx, {"tool": step["tool"], "attempt": 1})
                event("step_finished", idx, {"tool": step["tool"]})
            conn.execute(
                "INSERT INTO steps (task_id, idx, tool, input, status, output, attempts) "
                "VALUES (?,?,?,?,?,?,?)",
                (
                    task_id,
                    idx,
                    step["tool"],
                    dumps(step["input"]),
                    "done" if done else "pending",
                    dumps(outputs[idx]) if done else None,
                    1 if done else 0,
                ),
            )
        conn.execute("COMMIT")
    finally:
        conn.close()


def _pure_outputs(plan: Mapping[str, Any], count: int) -> dict[int, Any]:
    ctx: dict[int, Any] = {}
    for idx, step in enumerate(plan["steps"][:count]):
        ctx[idx] = expected_output(step["tool"], step["input"], ctx)
    return ctx


#: The restart-lab contract's three tables, as the guide's code creates them.
LEGACY_SCHEMA = (
    "CREATE TABLE tasks (id TEXT PRIMARY KEY, goal TEXT, status TEXT, created_at REAL, "
    "updated_at REAL)",
    "CREATE TABLE steps (task_id TEXT, idx INTEGER, tool TEXT, input TEXT, "
    "status TEXT DEFAULT 'pending', output TEXT, attempts INTEGER DEFAULT 0, "
    "PRIMARY KEY (task_id, idx))",
    "CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL, task_id TEXT, "
    "run_id TEXT, kind TEXT, step_idx INTEGER, data TEXT)",
)


class _Crasher:
    """The crash-point handler: a seeded coin at every point reached."""

    def __init__(self, rng: random.Random, config: SimConfig) -> None:
        self.rng = rng
        self.config = config
        self.crashes: list[str] = []

    def __call__(self, point: str, step: int | None) -> None:
        if (
            len(self.crashes) < self.config.max_crashes
            and self.rng.random() < self.config.crash_rate
        ):
            self.crashes.append(point)
            raise SimulatedCrash(point, step)


@dataclass
class _Seed:
    """One seed's world, as the seed draws it: folder, plan, fake tools and settings."""

    where: str
    db: str
    artifacts: str
    plan: dict[str, Any]
    world: World
    tools: Any
    settings: Settings
    #: Whether the task is stored already (a legacy database holds it).
    created: bool


def run_seed(seed: int, folder: str, config: SimConfig | None = None) -> SeedResult:
    """Simulate one seed in ``folder/seed-<seed>`` (removed again when it passes)."""
    config = config or SimConfig()
    sim = _draw_seed(seed, folder, config)
    crasher = _Crasher(random.Random(f"{seed}:crash"), config)
    problems: list[str] = []
    incarnations, lost = _run_incarnations(sim, crasher, config, problems)
    task, events = _read(sim.db)
    duplicates = _check(task, events, sim.plan, sim.world, sim.artifacts, problems)
    result = SeedResult(
        seed=seed,
        problems=tuple(problems),
        status=task.status.value,
        steps=len(sim.plan["steps"]),
        incarnations=incarnations,
        crashes=tuple(crasher.crashes),
        recoveries=sum(1 for e in events if e.kind == EventKind.STEP_RECOVERED.value),
        tool_failures=sum(1 for e in events if e.kind == EventKind.STEP_ERROR.value),
        duplicates=duplicates,
        lost_commits=lost,
    )
    if result.ok:
        shutil.rmtree(sim.where, ignore_errors=True)
    return result


def _draw_seed(seed: int, folder: str, config: SimConfig) -> _Seed:
    """A fresh folder, and the plan, tools and settings the seed draws; sometimes
    a database the guide's code left behind, which the runtime must take over."""
    from ..settings import Settings

    where = os.path.join(folder, f"seed-{seed}")
    shutil.rmtree(where, ignore_errors=True)
    os.makedirs(where)
    db, artifacts = os.path.join(where, "state.db"), os.path.join(where, "artifacts")
    plan_rng = random.Random(f"{seed}:plan")
    world = World()
    plan = make_plan(plan_rng, config.max_steps)
    rate = plan_rng.choice((0.0, config.tool_failure_rate, 5 * config.tool_failure_rate))
    flaky = dataclasses.replace(config, tool_failure_rate=rate)
    tools = sim_registry(world, random.Random(f"{seed}:tools"), flaky, artifacts)
    # No wait between attempts: the simulation's clock is fake, a real sleep only slows it.
    settings = Settings(
        max_attempts=config.max_attempts, artifacts=artifacts, workspace=where, backoff=0.0
    )
    if random.Random(f"{seed}:blobs").random() < config.blob_rate:
        settings = settings._replace(blob_threshold=0)  # every output out of the row
    created = False
    if plan_rng.random() < config.legacy_rate:
        pure = next(
            (i for i, s in enumerate(plan["steps"]) if s["tool"] not in PURE_TOOLS),
            len(plan["steps"]),
        )
        # Half the time the guide's run got as far as it could: with an all-pure
        # plan, every step done and only its separate task_done commit missing.
        done = pure if plan_rng.random() < 0.5 else plan_rng.randint(0, pure)
        write_legacy_database(db, plan, _pure_outputs(plan, done))
        created = True
    return _Seed(
        where=where, db=db, artifacts=artifacts, plan=plan, world=world, tools=tools,
        settings=settings, created=created,
    )  # fmt: skip


def _run_incarnations(
    sim: _Seed, crasher: _Crasher, config: SimConfig, problems: list[str]
) -> tuple[int, int]:
    """Open, run and (at the crasher's word) kill the task until it ends; between
    incarnations, check that nothing acknowledged was lost. Returns how many
    incarnations ran and how many commits were lost."""
    from ..runtime import Runtime
    from ..store import open_store

    observed: dict[int, Any] = {}
    lost = 0
    outcome: TaskStatus | None = None
    incarnations = 0
    previous = crashpoints.set_handler(crasher)
    try:
        while outcome is None:
            incarnations += 1
            if incarnations > config.max_crashes + 3:
                problems.append(f"no outcome after {incarnations - 1} incarnations")
                break
            store = None
            try:
                store = open_store(sim.db)
                runtime = Runtime(store, settings=sim.settings, tools=sim.tools)
                if not sim.created:
                    runtime.create(TASK_ID, sim.plan)
                    sim.created = True
                outcome = runtime.run(TASK_ID).status
            except SimulatedCrash:
                if config.bug == "silent_reset" and sim.created:
                    _silent_reset(sim.db)
            except TaskFailed:
                outcome = TaskStatus.FAILED
            finally:
                if store is not None:
                    store.close()  # the dead process's connection and lock go away
            if sim.created:
                lost += _observe(sim.db, observed, problems)
    finally:
        crashpoints.set_handler(previous)
    return incarnations, lost


def _silent_reset(db: str) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("UPDATE steps SET status = 'pending' WHERE status = 'running'")
    finally:
        conn.close()


def _read(db: str) -> tuple[Task, list[Event]]:
    from ..store import open_store
    from ..verify import read_consistent

    store = open_store(db, create=False)
    try:
        return read_consistent(store, TASK_ID)
    finally:
        store.close()


def _observe(db: str, observed: dict[int, Any], problems: list[str]) -> int:
    """Between incarnations: what is acknowledged done must stay done, unchanged.

    Read with plain SQL on the contract's tables, as an outside observer: opening
    a store here would migrate a database that no incarnation has opened yet.
    """
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT idx, status, output FROM steps WHERE task_id = ? ORDER BY idx", (TASK_ID,)
        ).fetchall()
    finally:
        conn.close()
    now = {
        idx: (status, load_json_object(output) if output is not None else None)
        for idx, status, output in rows
    }
    lost = 0
    for idx, output in observed.items():
        status, current = now.get(idx, (None, None))
        if status != StepStatus.DONE.value or current != output:
            problems.append(
                f"lost commit: step {idx} was done with {output!r}, now {status} with {current!r}"
            )
            lost += 1
    for idx, (status, output) in now.items():
        if status == StepStatus.DONE.value:
            observed.setdefault(idx, output)
    return lost


def _check(
    task: Task,
    events: list[Event],
    plan: Mapping[str, Any],
    world: World,
    artifacts: str,
    problems: list[str],
) -> int:
    from ..verify import check_artifacts, check_task

    problems.extend(str(v) for v in check_task(task, events))
    problems.extend(str(v) for v in check_artifacts(task, events, artifacts))
    if task.status not in (TaskStatus.DONE, TaskStatus.FAILED):
        problems.append(f"task ended {task.status.value}, neither done nor failed")
    finished: set[int] = set()
    for event in events:
        if event.kind == EventKind.STEP_FINISHED.value and event.step_idx is not None:
            finished.add(event.step_idx)
        elif event.kind == EventKind.STEP_STARTED.value and event.step_idx in finished:
            problems.append(
                f"step {event.step_idx} started again after it was done [seq {event.seq}]"
            )
    ctx = task.outputs()
    for step in task.steps:
        if step.status is not StepStatus.DONE:
            continue
        want = expected_output(step.tool, step.input, ctx)
        if want is not None and step.output != want:
            problems.append(
                f"step {step.idx} ({step.tool}) committed {step.output!r}, expected {want!r}"
            )
    duplicates = 0
    for key, inbox in sorted(world.delivered.items()):
        if len(inbox) > 1:
            duplicates += len(inbox) - 1
            problems.append(f"effect {key} delivered {len(inbox)} times")
    for step in task.steps:
        key = f"{task.id}-{step.idx}"
        if (
            step.tool == "sim_send"
            and step.status is StepStatus.DONE
            and key not in world.delivered
        ):
            problems.append(f"step {step.idx} is done but its message was never delivered")
    return duplicates


def run_seeds(seeds: Iterable[int], folder: str, config: SimConfig | None = None) -> SimReport:
    """Simulate every seed in ``seeds``; failing seeds are kept in ``folder``."""
    started = time.monotonic()
    results = [run_seed(seed, folder, config) for seed in seeds]
    points: Counter[str] = Counter()
    for result in results:
        points.update(result.crashes)
    return SimReport(
        seeds_run=len(results),
        failures=tuple(r for r in results if not r.ok),
        crashes=sum(len(r.crashes) for r in results),
        points=dict(points),
        recoveries=sum(r.recoveries for r in results),
        tool_failures=sum(r.tool_failures for r in results),
        duplicates=sum(r.duplicates for r in results),
        lost_commits=sum(r.lost_commits for r in results),
        done=sum(1 for r in results if r.status == TaskStatus.DONE.value),
        failed=sum(1 for r in results if r.status == TaskStatus.FAILED.value),
        elapsed=time.monotonic() - started,
    )


def scratch_folder() -> str:
    """A folder on a RAM-backed file system when there is one (fsync costs nothing
    there, so seeds run fast), else the system temp folder. The product's
    durability settings are never changed; only the medium is."""
    import tempfile

    shm = "/dev/shm"
    base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    return tempfile.mkdtemp(prefix="ninelives-sim-", dir=base)
