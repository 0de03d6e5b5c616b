"""mkdocs hook: every command's ``--help``, generated when the site is built.

A page marks where a help text goes with ``<!-- ninelives-help: COMMAND -->``
(``<!-- ninelives-help -->`` for the top-level one). Each marker is replaced by
what ``python -m ninelives COMMAND --help`` prints, run in a subprocess of the
interpreter building the site, so the reference never drifts from the parser.
A page holding markers must hold one for every command the top-level help
lists: a new command without its section fails the (strict) build.

The docstrings the API reference renders are written with Sphinx roles
(``:class:`~ninelives.errors.TaskExists```), which Markdown shows as typed; the
rendered page shows each as the code name alone (the last part after a ``~``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

MARKER = re.compile(r"<!-- ninelives-help(?:: ([\w-]+))? -->")
#: Where argparse lists the subcommands: ``    name   summary``, indented four.
COMMAND_LINE = re.compile(r"^    ([a-z][\w-]*)(?:\s|$)")
#: A Sphinx role as Markdown renders it: ``:class:<code>~a.b.C</code>``.
ROLE = re.compile(r":(?:class|func|meth|attr|data|exc|mod|obj):<code>(~?)([\w.]+)</code>")


def _help(*command: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NINELIVES_", "AGENT_"))}
    env["COLUMNS"] = "100"  # argparse wraps to the terminal: fix it, for a stable page
    proc = subprocess.run(
        [sys.executable, "-m", "ninelives", *command, "--help"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"ninelives {' '.join(command)} --help exited {proc.returncode}")
    return proc.stdout.rstrip("\n")


def _commands(top: str) -> list[str]:
    listing = top.partition("COMMAND\n")[2].partition("\n\n")[0]
    return [m.group(1) for line in listing.splitlines() if (m := COMMAND_LINE.match(line))]


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Replace each help marker of a page by the help text, in a ``text`` block."""
    wanted = MARKER.findall(markdown)
    if not wanted:
        return markdown
    top = _help()
    missing = sorted(set(_commands(top)) - set(wanted))
    if missing:
        raise RuntimeError(f"{page.file.src_path}: no help section for {', '.join(missing)}")

    def block(match: re.Match[str]) -> str:
        text = top if match.group(1) is None else _help(match.group(1))
        return f"```text\n{text}\n```"

    return MARKER.sub(block, markdown)


def on_page_content(html: str, **_: Any) -> str:
    """Show each Sphinx role of a rendered docstring as its code name."""

    def name(match: re.Match[str]) -> str:
        shown = match.group(2).rpartition(".")[2] if match.group(1) else match.group(2)
        return f"<code>{shown}</code>"

    return ROLE.sub(name, html)
