"""Reliability figures of the current code: kills, power cuts, I/O faults, simulation.

Each row is measured now, in this run, and counts duplicates, lost commits and
corrupt states, which must all be 0:

* kills: ``ninelives torture`` (real processes SIGKILLed at random, resumed,
  verified) on the guide's 3-step plan;
* power cuts: :mod:`ninelives.testing.powerloss`, a cut at every durable-state
  operation of the task (and torn cuts at every sync), then random cuts, one to
  three per scenario;
* I/O faults: :mod:`ninelives.testing.iofault`, every fsync, fdatasync, write
  and pwrite64 of a real ``run`` failed in turn with EIO and ENOSPC under
  strace, plus a real full disk on a small tmpfs (needs root or user namespaces);
* simulation: :mod:`ninelives.testing.simulation`, seeded in-process crashes.

    python bench/reliability.py                 # 1,000 kills, 1,000 cuts, 1,000 seeds
    python bench/reliability.py --quick         # the CI slice: 200 each, every fault
    python bench/reliability.py --only cuts,faults

Exit status 1 when any row found a problem.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

PARTS = ("kills", "cuts", "faults", "sim")


@dataclass(frozen=True, kw_only=True)
class Row:
    """One line of the table."""

    name: str
    count: int
    survived: int | None  # None: the tool does not attribute findings to single events
    duplicates: int
    lost: int
    corrupt: int
    other: int
    seconds: float
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not (self.duplicates or self.lost or self.corrupt or self.other)


def kills(count: int, seed: int) -> Row:
    """``torture`` of the guide's plan with ``count`` SIGKILLs."""
    from ninelives.testing.lab import GUIDE_PLAN, SUMMARY_NOTES
    from ninelives.torture import torture

    started = time.monotonic()
    work = tempfile.mkdtemp(prefix="reliability-kills-")
    try:
        os.makedirs(os.path.join(work, "input"))
        with open(os.path.join(work, "input", "notes.txt"), "w", encoding="utf-8") as fh:
            fh.write(SUMMARY_NOTES)
        plan = os.path.join(work, "plan.json")
        with open(plan, "w", encoding="utf-8") as fh:
            json.dump(GUIDE_PLAN, fh)
        report = torture(
            plan,
            kills=count,
            seed=seed,
            workers=2,
            folder=os.path.join(work, "run"),
            env={"NINELIVES_WORKSPACE": work},
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    corrupt = sum(": integrity:" in v for v in report.violations)
    return Row(
        name="kills (SIGKILL)",
        count=report.kills,
        survived=report.kills if report.ok else None,
        duplicates=report.duplicates,
        lost=report.lost_commits,
        corrupt=corrupt,
        other=len(report.violations) - corrupt,
        seconds=time.monotonic() - started,
        notes=tuple(report.violations[:5]),
    )


def cuts(count: int, seed: int) -> Row:
    """Power cuts: every operation of the task, torn cuts at every sync, then random."""
    from ninelives.testing.powerloss import campaign, sweep

    started = time.monotonic()
    reports = [sweep(torn_seeds=3), campaign(count, seed=seed)]
    total = sum(r.cuts for r in reports)
    return Row(
        name="power cuts",
        count=total,
        survived=total - sum(r.failed_cuts for r in reports),
        duplicates=sum(r.duplicates for r in reports),
        lost=sum(r.lost_commits for r in reports),
        corrupt=sum(r.corrupt for r in reports),
        other=sum(r.broken_artifacts + r.other for r in reports),
        seconds=time.monotonic() - started,
        notes=(
            f"{sum(r.torn_cuts for r in reports)} torn, "
            f"{sum(r.inflight_kept for r in reports)} kept the commit in flight",
            *[p for r in reports for p in r.problems][:5],
        ),
    )


def _classify(problems: list[str]) -> tuple[int, int, int, int]:
    duplicates = sum("not once each" in p or "artifacts" in p for p in problems)
    lost = sum("reported done, not stored" in p for p in problems)
    corrupt = sum("integrity_check" in p for p in problems)
    return duplicates, lost, corrupt, len(problems) - duplicates - lost - corrupt


#: Exit codes in the words of docs/reference/exit-codes.md, for the notes under the figures.
EXIT_MEANING = {
    0: "done", 1: "unknown task", 2: "failed", 3: "busy", 4: "bad input",
    5: "database unusable", 6: "outcome unknown", 7: "violations found", 130: "interrupted",
}  # fmt: skip


def exit_words(code: int) -> str:
    """``6`` -> ``exit 6 (outcome unknown)``; a negative code is a signal."""
    if code < 0:
        return f"killed by signal {-code}"
    return f"exit {code} ({EXIT_MEANING.get(code, 'unexpected')})"


def codes_in_words(counts: Mapping[int, int]) -> str:
    """``{6: 170, 0: 34}`` -> ``170 runs exit 6 (outcome unknown), 34 runs exit 0 (done)``."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{n} run{'s' if n != 1 else ''} {exit_words(code)}" for code, n in ranked)


def sequences_in_words(sequences: Iterable[Sequence[int]]) -> str:
    """``[(6, 0), (6, 0)]`` -> ``2 cases: exit 6 (outcome unknown), then exit 0 (done)``."""
    counted = Counter(tuple(codes) for codes in sequences)
    return "; ".join(
        f"{n} case{'s' if n != 1 else ''}: " + ", then ".join(exit_words(c) for c in codes)
        for codes, n in sorted(counted.items(), key=lambda item: -item[1])
    )


def faults(_count: int, _seed: int) -> Row:
    """Every fault point of a run, with EIO and ENOSPC; then a real full disk."""
    from ninelives.testing.iofault import SmallDiskUnavailable, full_disk, sweep

    started = time.monotonic()
    report = sweep()
    problems = report.problems
    clean = sum(not o.problems for o in report.outcomes)
    count = report.faults
    calls = ", ".join(f"{n} {name}" for name, n in report.counts.items())
    notes = [f"faulted calls: {calls}; {codes_in_words(report.exit_codes())}"]
    try:
        disk = full_disk()
    except SmallDiskUnavailable as exc:
        notes.append(f"full disk NOT RUN: {exc}")
        disk = []
    count += len(disk)
    clean += sum(not o.problems for o in disk)
    problems += [f"full disk {o.name}: {p}" for o in disk for p in o.problems]
    notes.append(f"full disk: {sequences_in_words(o.exit_codes for o in disk)}")
    duplicates, lost, corrupt, other = _classify(problems)
    return Row(
        name="I/O faults",
        count=count,
        survived=clean,
        duplicates=duplicates,
        lost=lost,
        corrupt=corrupt,
        other=other,
        seconds=time.monotonic() - started,
        notes=(*notes, *problems[:5]),
    )


def simulation(count: int, seed: int) -> Row:
    """``count`` seeds of the in-process crash simulation."""
    from ninelives.testing.simulation import run_seeds, scratch_folder

    started = time.monotonic()
    folder = scratch_folder()
    try:
        report = run_seeds(range(seed, seed + count), folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    problems = [p for r in report.failures for p in r.problems]
    corrupt = sum("integrity" in p for p in problems)
    return Row(
        name="simulation seeds",
        count=report.seeds_run,
        survived=report.seeds_run - len(report.failures),
        duplicates=report.duplicates,
        lost=report.lost_commits,
        corrupt=corrupt,
        other=max(0, len(report.failures) - corrupt)
        if not (report.duplicates or report.lost_commits)
        else 0,
        seconds=time.monotonic() - started,
        notes=(f"{report.crashes} simulated crashes, {report.recoveries} recoveries",),
    )


RUNNERS: dict[str, Callable[[int, int], Row]] = {
    "kills": kills,
    "cuts": cuts,
    "faults": faults,
    "sim": simulation,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=1000, help="SIGKILLs (default 1000)")
    parser.add_argument("--cuts", type=int, default=1000, help="random power cuts (1000)")
    parser.add_argument("--seeds", type=int, default=1000, help="simulation seeds (1000)")
    parser.add_argument("--seed", type=int, default=20240601, help="seed of every schedule")
    parser.add_argument("--quick", action="store_true", help="200 kills, cuts and seeds")
    parser.add_argument("--only", default=",".join(PARTS), help=f"some of {','.join(PARTS)}")
    args = parser.parse_args(argv)
    if args.quick:
        args.kills = args.cuts = args.seeds = 200
    wanted = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = sorted(set(wanted) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {unknown}; choose from {','.join(PARTS)}")
    sizes = {"kills": args.kills, "cuts": args.cuts, "faults": 0, "sim": args.seeds}
    header = f"{'':18} {'count':>7} {'survived':>9} {'dups':>5} {'lost':>5} {'corrupt':>8} "
    print(header + f"{'other':>6} {'time':>8}")
    rows = []
    for part in PARTS:
        if part not in wanted:
            continue
        row = RUNNERS[part](sizes[part], args.seed)
        rows.append(row)
        survived = "?" if row.survived is None else str(row.survived)
        print(
            f"{row.name:18} {row.count:>7} {survived:>9} {row.duplicates:>5} {row.lost:>5} "
            f"{row.corrupt:>8} {row.other:>6} {row.seconds:>7.1f}s",
            flush=True,
        )
        for note in row.notes:
            print(f"{'':18}   {note}", flush=True)
    verdict = all(r.ok for r in rows)
    print("all clean" if verdict else "PROBLEMS FOUND")
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
