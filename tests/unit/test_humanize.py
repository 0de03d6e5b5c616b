"""Ages and durations, written once for the log, the CLI, the web view and the report."""

from __future__ import annotations

import pytest

from ninelives.humanize import age, duration


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.0032, "3.2 ms"),
        (0.045, "45 ms"),
        (1.25, "1.2 s"),
        (119.9, "119.9 s"),
        (240, "4 min"),
        (7199, "120 min"),
        (9000, "2.5 h"),
    ],
)
def test_duration(seconds: float, shown: str) -> None:
    assert duration(seconds) == shown


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(-3, "0s"), (45.9, "45s"), (60, "1m"), (3 * 3600 + 5, "3h"), (2 * 86400 + 10, "2d")],
)
def test_age(seconds: float, shown: str) -> None:
    assert age(seconds) == shown


def test_the_log_the_bar_and_the_report_use_the_one_rule() -> None:
    from ninelives import report
    from ninelives.cli import bar, ops, webui
    from ninelives.runtime import steps

    assert bar.duration is duration
    assert report.duration is duration
    assert steps.duration is duration
    assert ops.age is age
    assert webui.age is age
