"""Code blocks of a Markdown file, and a shell runner for ``sh`` and ``console`` blocks.

Used by the tests that run the commands of the README and the docs pages as
written: ``sh`` blocks run verbatim; in ``console`` blocks each ``$ `` line is
a command, its expected exit code is 0 unless a trailing comment says ``exit
N``, and each expected output line below it (except elided ones with ``…`` and
JSON, which the pages wrap) must appear in what the command printed.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced code block: its language tag, text, first line number and the
    file it comes from (as the tests name it, e.g. ``docs/guides/agents.md``)."""

    lang: str
    text: str
    line: int
    source: str = ""

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}" if self.source else f"line {self.line}"

    @property
    def first(self) -> str:
        return self.text.splitlines()[0] if self.text else ""


def blocks(path: Path, source: str = "") -> list[Block]:
    """Every fenced block of a Markdown file, in order; ``source`` names the file."""
    found: list[Block] = []
    lang: str | None = None
    body: list[str] = []
    start = 0
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        match = FENCE.match(line)
        if lang is None and match:
            lang, body, start = match.group(1), [], number + 1
        elif lang is not None and line.startswith("```"):
            found.append(Block(lang, "\n".join(body) + "\n", start, source))
            lang = None
        elif lang is not None:
            body.append(line)
    return found


@dataclass
class Command:
    """One ``$`` line of a console block, what it should print and its exit code."""

    text: str
    expected_exit: int
    expected_lines: list[str] = field(default_factory=list)


def console_commands(block: Block) -> list[Command]:
    commands: list[Command] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            comment = line.partition("  #")[2]
            code = re.search(r"\bexit (\d+)", comment)
            commands.append(Command(line[2:], int(code.group(1)) if code else 0))
        elif commands and line.strip() and "…" not in line and line.lstrip()[:1] not in "{[":
            commands[-1].expected_lines.append(line.strip())
    return commands


def _loose(line: str) -> str:
    """A pattern for an expected output line: any run of spaces, any timing."""
    pattern = re.escape(line)
    pattern = re.sub(r"(\\ )+", r"\\s+", pattern)
    return re.sub(r"\d+\\\.\d+", r"[\\d.]+", pattern)


@dataclass
class Outcome:
    """What each step of a shell script did: ``(label, exit code, output)``."""

    steps: list[tuple[str, int, str]]
    stdout: str
    stderr: str
    returncode: int


def run_shell(
    parts: Sequence[Block], cwd: Path, env: Mapping[str, str], *, timeout: float = 300
) -> tuple[Outcome, list[str]]:
    """Run ``sh`` blocks verbatim and ``console`` commands one by one, in one bash
    process (so ``cd`` and ``export`` carry over, as in a terminal); return the
    outcome and every mismatch with what the blocks say."""
    script = ["set -o errexit -o pipefail"]
    expected: list[tuple[str, int, list[str]]] = []
    for block in parts:
        if block.lang == "console":
            for command in console_commands(block):
                n = len(expected)
                expected.append((command.text, command.expected_exit, command.expected_lines))
                script.append(f"echo '@@begin {n}'")
                script.append(f"if {{ {command.text}\n}} 2>&1; then rc=0; else rc=$?; fi")
                script.append(f'echo; echo "@@end {n} $rc"')
        else:
            n = len(expected)
            expected.append((f"sh block at {block.where}", 0, []))
            script.append(f"echo '@@begin {n}'")
            script.append(f"{{\n{block.text}\n}} 2>&1")
            script.append(f"echo; echo '@@end {n} 0'")
    proc = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    outputs = dict(
        (int(m.group(1)), (int(m.group(3)), m.group(2)))
        for m in re.finditer(r"@@begin (\d+)\n(.*?)\n@@end \1 (\d+)", proc.stdout, re.S)
    )
    problems = []
    steps = []
    for n, (label, code, lines) in enumerate(expected):
        if n not in outputs:
            problems.append(f"{label}: did not complete (bash exit {proc.returncode})")
            break
        got, output = outputs[n]
        steps.append((label, got, output))
        if got != code:
            problems.append(f"{label}: exit {got}, the page says {code}\n{output}")
        for line in lines:
            if not re.search(_loose(line), output):
                problems.append(f"{label}: does not print {line!r}; it printed:\n{output}")
    if proc.returncode != 0:
        problems.append(f"bash exited {proc.returncode}: {proc.stderr[-2000:]}")
    return Outcome(steps, proc.stdout, proc.stderr, proc.returncode), problems
