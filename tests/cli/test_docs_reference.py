"""The reference pages say what the code does: every exit code and every
environment variable, no more and no fewer (the ``--help`` texts need no test:
the site's build generates them, scripts/mkdocs_hooks.py)."""

from __future__ import annotations

import re
from pathlib import Path

from test_fuzz import DOCUMENTED

from ninelives import cli

ROOT = Path(__file__).resolve().parents[2]
EXIT_CODES = ROOT / "docs" / "reference" / "exit-codes.md"
ENVIRONMENT = ROOT / "docs" / "reference" / "environment.md"
#: A variable's name as the code spells it; the suite's own switches are not the user's.
VARIABLE = re.compile(r"""["']((?:AGENT|NINELIVES|OLLAMA)_[A-Z_]+)["']""")
TEST_ONLY = "NINELIVES_TEST_"


def documented_codes() -> set[int]:
    table = EXIT_CODES.read_text(encoding="utf-8").partition("| exit | meaning |")[2]
    return {int(code) for code in re.findall(r"^\| (\d+) \|", table, re.M)}


def test_the_exit_code_table_lists_every_code_the_command_returns() -> None:
    returned = {0, cli.EXIT_INTERRUPTED} | {code for _, code in cli.EXIT_CODES}
    assert documented_codes() == returned


def test_the_fuzzed_codes_are_documented() -> None:
    assert DOCUMENTED <= documented_codes()


def test_the_environment_table_lists_every_variable_the_code_reads() -> None:
    read = set()
    for source in (ROOT / "src" / "ninelives").rglob("*.py"):
        read |= set(VARIABLE.findall(source.read_text(encoding="utf-8")))
    read = {name for name in read if not name.startswith(TEST_ONLY)}
    table = ENVIRONMENT.read_text(encoding="utf-8")
    documented = set(re.findall(r"`((?:AGENT|NINELIVES|OLLAMA)_[A-Z_]+)", table))
    assert read, "no variable found in the code: the pattern no longer matches it"
    assert documented == read
