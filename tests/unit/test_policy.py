"""Step policies as pure functions: the limits in force, the jittered wait, the
journaled decision, and progress checked like an output."""

from __future__ import annotations

import math

import pytest

from ninelives.errors import OutputRefused
from ninelives.policy import (
    DEFAULT_CAP,
    Limits,
    encode_progress,
    error_data,
    limits_for,
    retry_delay,
)


def test_a_step_without_a_policy_gets_the_settings() -> None:
    assert limits_for(None, 3, 0.5) == Limits(3, None, 0.5, DEFAULT_CAP)


def test_a_step_policy_overrides_the_settings() -> None:
    policy = {"max_attempts": 7, "timeout": 2, "backoff": {"base": 1, "cap": 5}}
    assert limits_for(policy, 3, 0.5) == Limits(7, 2.0, 1.0, 5.0)
    assert limits_for({"backoff": False}, 3, 0.5).base == 0
    assert limits_for({"backoff": {"cap": 4}}, 3, 0.5) == Limits(3, None, 0.5, 4.0)


def test_backoff_zero_in_the_settings_turns_every_wait_off() -> None:
    limits = limits_for({"backoff": {"base": 10, "cap": 60}}, 3, 0.0)
    assert retry_delay(limits, 1, lambda: 0.99) == 0.0


@pytest.mark.parametrize("attempt", [1, 2, 3, 6, 10, 100])
def test_the_wait_is_half_to_all_of_the_capped_exponential(attempt: int) -> None:
    limits = Limits(3, None, 0.5, 30.0)
    ceiling = min(0.5 * 2 ** (attempt - 1), 30.0)
    assert retry_delay(limits, attempt, lambda: 0.0) == ceiling / 2
    assert math.isclose(retry_delay(limits, attempt, lambda: 0.999999), ceiling, rel_tol=1e-5)
    assert ceiling / 2 <= retry_delay(limits, attempt) <= ceiling


def test_the_journaled_decision() -> None:
    waiting = error_data("boom", 1, None, why=None, retry_at=100.0, delay=2.0)
    assert waiting == {"error": "boom", "attempt": 1, "retry_at": 100.0, "delay": 2.0}
    final = error_data("boom", 3, {"timeout": 1}, why="attempt_limit", retry_at=None, delay=None)
    assert final == {"error": "boom", "attempt": 3, "timeout": 1, "final": True,
                     "why": "attempt_limit"}  # fmt: skip
    at_once = error_data("boom", 1, None, why=None, retry_at=None, delay=None)
    assert at_once == {"error": "boom", "attempt": 1}


def test_progress_is_checked_like_an_output() -> None:
    assert encode_progress({"next": 3, "b": [1]}, 1024) == '{"b":[1],"next":3}'
    assert encode_progress(7, 1024) == "7"
    with pytest.raises(OutputRefused, match="progress refused"):
        encode_progress({"x": float("nan")}, 1024)
    with pytest.raises(OutputRefused, match="progress refused"):
        encode_progress({"x": "\ud800"}, 1024)
    with pytest.raises(OutputRefused, match="exceed the maximum"):
        encode_progress("x" * 2000, 1024)
