"""``import ninelives.cli`` stays standard-library only and light."""

from __future__ import annotations

import json
import subprocess
import sys

from ninelives.testing import Lab

#: Modules the command's start-up path must not load (slow or third-party).
HEAVY = ["psycopg", "asyncio", "hashlib", "_hashlib", "importlib.metadata"]

#: Every standard-library module (by top-level name, leading underscore aside)
#: that ``import ninelives.cli`` may load, on Python 3.10 to 3.13. A list of
#: what is allowed, not of what is heavy: a new import (shutil, which argparse's
#: help formatter is kept from loading; dataclasses, subprocess, tempfile, zipfile,
#: email, http.client: 10-55 ms each) fails the test until it is made lazy or added here.
LIGHT = frozenset(
    {
        "argparse", "collections", "contextlib", "copyreg", "enum", "functools",
        "genericpath", "gettext", "itertools", "json", "keyword", "locale", "operator",
        "os", "posixpath", "re", "reprlib", "sre_compile", "sre_constants", "sre_parse",
        "stat", "types", "typing", "warnings",
    }
)  # fmt: skip

PROBE = """
import json, sys
before = set(sys.modules)
{imports}
new = sorted(set(sys.modules) - before)
print(json.dumps(new))
"""


def loaded_by(imports: str) -> list[str]:
    """The modules that running ``imports`` adds, in a fresh interpreter."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(imports=imports)],
        capture_output=True,
        text=True,
        check=True,
    )
    return list(json.loads(proc.stdout))


def not_light(modules: list[str]) -> list[str]:
    """The standard-library packages in ``modules`` that :data:`LIGHT` does not allow."""
    tops = {m.split(".")[0] for m in modules}
    return sorted(t for t in tops - LIGHT if not t.startswith("_") and t != "ninelives")


def third_party(modules: list[str]) -> list[str]:
    return [
        m
        for m in modules
        if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] != "ninelives"
    ]


def test_import_cli_loads_only_the_standard_library_and_nothing_heavy() -> None:
    modules = loaded_by("import ninelives.cli")
    assert "ninelives.cli" in modules
    assert third_party(modules) == []
    assert not_light(modules) == []
    assert [m for m in HEAVY if m in modules] == []
    # Nor the runtime, the stores or the tools: they load when a command needs them.
    lazy = ("ninelives.runtime", "ninelives.store", "ninelives.tools", "ninelives.testing")
    assert [m for m in modules if m.startswith(lazy)] == []
    # Nor the web view (http.server) or the live bar (threading): ui and a terminal load them.
    assert [
        m for m in ("ninelives.cli.webui", "ninelives.cli.bar", "http.server") if m in modules
    ] == []


def test_import_ninelives_alone_is_as_light() -> None:
    modules = loaded_by("import ninelives")
    assert third_party(modules) == []
    assert not_light(modules) == []
    assert [m for m in HEAVY if m in modules] == []


def test_the_probe_sees_heavy_imports() -> None:
    # The control: the store and the lock-file naming do load sqlite3 and
    # hashlib, and the same probe reports them.
    modules = loaded_by(
        "import ninelives.store.sqlite.store, ninelives.locking\n"
        "ninelives.locking.lock_path('state.db', 't')"
    )
    assert "sqlite3" in modules
    assert "hashlib" in modules
    assert third_party(loaded_by("import pytest")) != []
    # And a module of the standard library that is not on the light list.
    found = not_light(loaded_by("import ninelives.cli, shutil, dataclasses"))
    assert {"shutil", "dataclasses", "inspect"} <= set(found)


def test_status_and_export_read_without_the_runtime(sqlite_lab: Lab) -> None:
    """The read-only commands open the store alone: no runtime, settings or tools."""
    sqlite_lab.guide_setup()
    assert sqlite_lab.cli("create", "t", "plan.json").returncode == 0
    for command in ("status", "export"):
        code = (
            "import contextlib, io, os\n"
            f"os.chdir({str(sqlite_lab.root)!r})\n"
            "from ninelives.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    assert main([{command!r}, 't']) == 0\n"
        )
        modules = loaded_by(code)
        assert "ninelives.store.sqlite.reader" in modules  # the control: it did read
        heavy = ("ninelives.runtime", "ninelives.settings", "ninelives.tools", "ninelives.policy")
        assert [m for m in modules if m.startswith(heavy)] == [], command
