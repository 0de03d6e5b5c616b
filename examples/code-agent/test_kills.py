"""Every step of report_agent killed at every crash point, an outside kill, the lock
test and a negative control: one call of ninelives' kill-test kit."""

from pathlib import Path

from ninelives.testing import kill_matrix

NOTES = (Path(__file__).parent / "input" / "notes.md").read_text(encoding="utf-8")

test_report_agent = kill_matrix(
    workflow="report_agent",
    args=["Summarize the notes for the team"],
    tools="code_agent",  # code_agent.py, beside this file
    files={"input/notes.md": NOTES},
    artifact_tools=["write_artifact"],
    negative_env={"CODE_AGENT_UNSAFE": "1"},
)
