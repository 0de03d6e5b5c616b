"""``worker --group-commit`` options: off by default, from flags or the environment."""

from __future__ import annotations

import pytest

from ninelives.errors import InputError
from ninelives.worker import WorkerOptions


def test_group_commit_is_off_by_default() -> None:
    options = WorkerOptions.from_env("state.db", env={})
    assert (options.group_commit, options.group_linger) == (False, 0.002)


def test_the_environment_turns_it_on_and_sets_the_linger() -> None:
    env = {"NINELIVES_GROUP_COMMIT": "1", "NINELIVES_GROUP_COMMIT_LINGER_MS": "5"}
    options = WorkerOptions.from_env("state.db", env=env)
    assert (options.group_commit, options.group_linger) == (True, 0.005)


def test_flags_win_over_the_environment() -> None:
    env = {"NINELIVES_GROUP_COMMIT": "0", "NINELIVES_GROUP_COMMIT_LINGER_MS": "5"}
    options = WorkerOptions.from_env("state.db", group_commit=True, group_linger_ms=0, env=env)
    assert (options.group_commit, options.group_linger) == (True, 0.0)


@pytest.mark.parametrize(
    "env",
    [
        {"NINELIVES_GROUP_COMMIT": "maybe"},
        {"NINELIVES_GROUP_COMMIT_LINGER_MS": "soon"},
        {"NINELIVES_GROUP_COMMIT_LINGER_MS": "-1"},
        {"NINELIVES_GROUP_COMMIT_LINGER_MS": "5000"},
    ],
)
def test_bad_values_are_input_errors(env: dict[str, str]) -> None:
    with pytest.raises(InputError):
        WorkerOptions.from_env("state.db", env=env)
