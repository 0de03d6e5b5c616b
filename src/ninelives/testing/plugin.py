"""pytest plugin (entry point ``pytest11``): kill-test fixtures for users' own plans.

Loaded by pytest in every environment where ninelives is installed, so it
must stay cheap to import and register nothing that a test did not ask for:
it imports nothing but pytest here, adds one marker, one ini option and one
fixture, and its only hook returns at once for tests that do not take a
``ninelives_case`` argument.

A test that takes ``ninelives_case`` is run once per case of a plan's kill
matrix (see :mod:`ninelives.testing.kit`); the plan comes from the marker,
else from the ini option::

    @pytest.mark.ninelives("plan.json", files={"input/notes.txt": "a\\nb\\nc\\n"})
    def test_my_plan(ninelives_case, tmp_path):
        ninelives_case.check(tmp_path)

A workflow takes the marker's keywords instead of a plan:
``@pytest.mark.ninelives(workflow="triage", args=["T-7"], tools="triage_app")``.

A marker's relative plan path resolves against the test file's folder, the
ini option's against the rootdir. ``ninelives_lab`` gives any test a scratch
:class:`~ninelives.testing.lab.Lab` whose spawned processes are killed at teardown.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CASE_ARG = "ninelives_case"


def pytest_addoption(parser: pytest.Parser) -> None:
    """The ``ninelives_plan`` ini option."""
    parser.addini(
        "ninelives_plan",
        "plan file whose kill matrix parametrizes tests taking `ninelives_case`",
        default="",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``ninelives`` marker (so ``--strict-markers`` accepts it)."""
    config.addinivalue_line(
        "markers",
        "ninelives(plan, **options): run the test once per case of the plan's kill matrix "
        "(options of ninelives.testing.kit.KillKit)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``ninelives_case`` with the kill matrix of the test's plan."""
    if CASE_ARG not in metafunc.fixturenames:
        return
    if any(CASE_ARG in m.args[:1] for m in metafunc.definition.iter_markers("parametrize")):
        return  # already parametrized, e.g. by kit.kill_matrix
    marker = metafunc.definition.get_closest_marker("ninelives")
    options: dict[str, Any] = dict(marker.kwargs) if marker is not None else {}
    if marker is not None and marker.args:
        plan: Any = marker.args[0]
        options.setdefault("base", os.path.dirname(str(metafunc.definition.path)))
    elif "plan" in options or "workflow" in options:
        plan = options.pop("plan", None)
        options.setdefault("base", os.path.dirname(str(metafunc.definition.path)))
    else:
        plan = metafunc.config.getini("ninelives_plan")
        options.setdefault("base", str(metafunc.config.rootpath))
    if not plan and not options.get("workflow"):
        raise pytest.UsageError(
            f"{metafunc.definition.nodeid} takes {CASE_ARG} but names no plan: mark it "
            "@pytest.mark.ninelives('plan.json') or set the ini option ninelives_plan"
        )
    from .kit import KillKit, bound_cases

    cases = bound_cases(KillKit(plan, **options))
    metafunc.parametrize(CASE_ARG, cases, ids=[c.id for c in cases])


@pytest.fixture
def ninelives_lab(tmp_path: Path) -> Iterator[Any]:
    """A :class:`~ninelives.testing.lab.Lab` in a fresh folder, running this
    interpreter's ``ninelives`` with every ``AGENT_*`` variable scrubbed."""
    from .lab import Lab

    lab = Lab(tmp_path / "lab")
    try:
        yield lab
    finally:
        lab.reap()
