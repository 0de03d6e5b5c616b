"""What a workflow step costs against a plan step, measured in one run.

The same 3-step task two ways, with tools that do no I/O of their own (the
stub tools of ``step_overhead.py``): the guide's plan through the library API,
and a workflow whose three ``ctx.step`` calls call the same functions. Each
round creates and runs ``--tasks`` / ``--rounds`` tasks of each, in two files
of one folder, alternating which goes first, so that both share the
machine's noise; the script prints the medians over rounds of the time per
step (run only, and create + run) and their ratios. The aim is a workflow
step at most 1.2x a plan step.

    python bench/workflow_step.py [--tasks 300] [--rounds 5] [--dir DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from step_overhead import PLAN, stub_tools, time_ninelives  # noqa: E402

import ninelives  # noqa: E402
from ninelives.settings import Settings  # noqa: E402

#: The aim: a workflow step costs at most this many plan steps.
AIM = 1.2
STUB = stub_tools()


def _tool(name: str) -> Any:
    """The stub tool's function, called as a plan's step would call it."""
    fn = STUB.lookup(name).fn
    return lambda: fn({}, {}, ninelives.current_step().idem_key)  # type: ignore[union-attr]


FETCH, SUMMARIZE, WRITE = _tool("fetch"), _tool("summarize"), _tool("write_artifact")


@ninelives.workflow("stub_report")
def stub_report(ctx: Any) -> Any:
    """The stub plan's three steps as code."""
    ctx.step("fetch", FETCH)
    ctx.step("summarize", SUMMARIZE)
    return ctx.step("write_artifact", WRITE)


def step_overhead_plan() -> dict[str, Any]:
    """The plan the plan rows run (``step_overhead.PLAN``)."""
    return PLAN


def time_workflow(folder: Path, tasks: int, start: int) -> tuple[float, float]:
    """Seconds to create and to run ``tasks`` tasks of ``stub_report``, in ``wf.db``."""
    settings = Settings(artifacts=str(folder / "artifacts"))
    with ninelives.open(str(folder / "wf.db"), settings=settings, tools=stub_tools()) as rt:
        ids = [f"w{start + i}" for i in range(tasks)]
        t0 = time.perf_counter()
        for task_id in ids:
            rt.create(task_id, stub_report)
        t1 = time.perf_counter()
        for task_id in ids:
            rt.run(task_id)
        t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def check(folder: Path, tasks: int) -> list[str]:
    """What is wrong with the runs (empty when every task of both kinds is done)."""
    problems = []
    for db, prefix in (("state.db", "t"), ("wf.db", "w")):
        with ninelives.open(str(folder / db), tools=stub_tools()) as rt:
            for i in range(tasks):
                task = rt.status(f"{prefix}{i}")
                steps = [s for s in task.steps if s.status.value == "done"]
                if task.status.value != "done" or len(steps) != 3:
                    problems.append(f"{db} {task.id}: {task.status.value}, {len(steps)} steps")
    return problems


def measure(tasks: int, rounds: int, folder: str | None = None) -> dict[str, Any]:
    """Interleaved rounds; medians of the per-step times and their ratios."""
    per_round = max(1, tasks // rounds)
    steps = 3 * per_round
    times: dict[str, list[float]] = {k: [] for k in ("plan_run", "plan_all", "wf_run", "wf_all")}
    with tempfile.TemporaryDirectory(prefix="wfstep-", dir=folder) as tmp:
        root = Path(tmp)
        for r in range(rounds):
            start = r * per_round
            order = ("plan", "wf") if r % 2 == 0 else ("wf", "plan")
            for kind in order:
                if kind == "plan":
                    create_s, run_s = time_ninelives(root, per_round, start)
                else:
                    create_s, run_s = time_workflow(root, per_round, start)
                times[f"{kind}_run"].append(run_s / steps)
                times[f"{kind}_all"].append((create_s + run_s) / steps)
        problems = check(root, per_round * rounds)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    return {
        "tasks": per_round * rounds,
        "rounds": rounds,
        "plan_step_ms": {"run": med["plan_run"], "create_run": med["plan_all"]},
        "workflow_step_ms": {"run": med["wf_run"], "create_run": med["wf_all"]},
        "ratio": {
            "run": med["wf_run"] / med["plan_run"],
            "create_run": med["wf_all"] / med["plan_all"],
        },
        "aim": AIM,
        "problems": problems,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=300, help="tasks of each kind (default 300)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--dir", help="folder for the databases (default: the temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    if args.tasks < 1 or args.rounds < 1:
        parser.error("--tasks and --rounds must be at least 1")
    for name in list(os.environ):
        if name.startswith(("AGENT_", "NINELIVES_")):
            del os.environ[name]  # crash points, delays or another database would skew it
    result = measure(args.tasks, args.rounds, args.dir)
    if args.json:
        print(json.dumps(result))
    else:
        plan, flow, ratio = result["plan_step_ms"], result["workflow_step_ms"], result["ratio"]
        print(f"tasks: {result['tasks']} of each x 3 steps, {args.rounds} rounds (medians)")
        print(f"plan step, run only:              {plan['run']:8.3f} ms")
        print(f"workflow step, run only:          {flow['run']:8.3f} ms")
        print(f"plan step, create + run:          {plan['create_run']:8.3f} ms")
        print(f"workflow step, create + run:      {flow['create_run']:8.3f} ms")
        print(f"workflow / plan step (run only):     {ratio['run']:5.2f}x (aim <= {AIM}x)")
        print(f"workflow / plan step (create + run): {ratio['create_run']:5.2f}x (aim <= {AIM}x)")
        for problem in result["problems"]:
            print(f"FAILED: {problem}")
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
