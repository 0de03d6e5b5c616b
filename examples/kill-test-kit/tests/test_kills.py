"""Every step of plan.json killed at every crash point, plus an outside kill,
the lock test and a negative control: one line of ninelives' kill-test kit."""

from ninelives.testing import kill_matrix

test_shout_plan = kill_matrix(
    "../plan.json",
    files={"input/notes.txt": "Buy milk\n\nCall Ann  \nShip the release\nRest\n"},
    artifact_tools=["shout"],
    negative_env={"SHOUT_UNSAFE": "1"},
)
