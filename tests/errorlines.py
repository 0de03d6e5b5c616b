"""The one check of a refused command the CLI tests share: its exit code, one
``ninelives: error:`` line on stderr (no traceback) holding the words given."""

from __future__ import annotations

from ninelives.testing import Result


def one_line(result: Result, code: int, *words: str) -> str:
    """Exit ``code``, one ``ninelives: error:`` line holding ``words``, no traceback;
    the line."""
    assert result.returncode == code, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ninelives: error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]
