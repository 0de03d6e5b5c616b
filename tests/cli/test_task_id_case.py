"""Task ids are unique regardless of case, on every backend: ``Demo`` and ``demo``
would publish to one artifact name on a case-insensitive file system."""

from __future__ import annotations

from ninelives.testing import Lab


def test_create_of_an_id_equal_but_for_case_is_refused(lab: Lab) -> None:
    lab.guide_setup()
    assert lab.cli("create", "Demo", "plan.json").returncode == 0
    before = lab.fingerprint("Demo", "demo")
    result = lab.cli("create", "demo", "plan.json")
    assert result.returncode == 4, result
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        "ninelives: error: task 'demo' already exists as 'Demo' "
        "(task ids are unique regardless of case)"
    ]
    assert lab.fingerprint("Demo", "demo") == before
    assert lab.cli("status", "demo").returncode == 1
    # The control: the stored spelling runs, and an id differing by more than case is new.
    assert lab.cli("run", "Demo").returncode == 0
    assert lab.cli("create", "demo2", "plan.json").returncode == 0
    assert sorted(lab.artifacts()) == ["Demo-2.md"]
