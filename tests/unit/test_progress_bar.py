"""The progress convention and the bar's throttle, without a terminal."""

from __future__ import annotations

import io
from typing import Any

import pytest

from ninelives.cli.bar import TerminalBar, counts
from ninelives.models import StepProgress


@pytest.mark.parametrize(
    ("progress", "expected"),
    [
        ({"done": 3, "total": 10}, (3, 10)),
        ({"done": 3, "total": 10, "cursor": "abc"}, (3, 10)),  # other keys beside are fine
        ({"done": 3}, (3, None)),
        ({"done": 3, "total": 0}, (3, None)),
        ({"done": True, "total": 3}, None),
        ({"done": -1, "total": 3}, None),
        ({"done": 1.5, "total": 3}, None),
        ({"next": 4}, None),
        ([1, 2], None),
        (None, None),
    ],
)
def test_counts_follow_the_convention_and_nothing_else(progress: Any, expected: Any) -> None:
    assert counts(progress) == expected


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_redraws_are_throttled_and_a_line_replaces_the_bar() -> None:
    out, clock = io.StringIO(), Clock()
    bar = TerminalBar(out, lambda text: text, clock=clock)
    for i in range(1, 11):  # ten updates within 0.05 s: one redraw
        clock.now = i * 0.005
        bar.update(StepProgress("t", 0, "count", {"done": i, "total": 10}, 0.5))
    assert out.getvalue() == "\r\x1b[Kt: step 0 count [##..................] 1/10  500 ms"
    clock.now = 0.2
    bar.update(StepProgress("t", 0, "count", {"done": 20, "total": 10}, 1.5))  # clamped
    assert out.getvalue().endswith("[####################] 20/10  1.5 s")
    bar.above(lambda: out.write("t: step 0 count done\n"))
    assert out.getvalue().endswith("1.5 s\r\x1b[Kt: step 0 count done\n")
    bar.above(lambda: out.write("t: done\n"))  # no bar shown: nothing to erase
    assert out.getvalue().endswith("count done\nt: done\n")
