"""Effect helpers in a scratch folder: publish once, orphan cleanup, the stub summary."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from ninelives.errors import ToolError
from ninelives.tools.builtin import stub_summary
from ninelives.tools.effects import append_unsafe, is_temp_of, publish_once, remove_orphans

TEXT = b"Line one\nLine two\nLine three"


def test_publish_writes_the_whole_content_and_leaves_no_temp_file(tmp_path: Path) -> None:
    folder = tmp_path / "artifacts"  # created on demand
    published = publish_once(str(folder), "t-2.md", TEXT)
    assert published.deduplicated is False
    assert published.path == str(folder / "t-2.md")
    assert published.sha256 == hashlib.sha256(TEXT).hexdigest()
    assert published.size == len(TEXT)
    assert os.listdir(folder) == ["t-2.md"]
    assert (folder / "t-2.md").read_bytes() == TEXT


def test_publishing_the_same_content_again_is_deduplicated(tmp_path: Path) -> None:
    first = publish_once(str(tmp_path), "t-2.md", TEXT)
    inode = (tmp_path / "t-2.md").stat().st_ino
    again = publish_once(str(tmp_path), "t-2.md", TEXT)
    assert again.deduplicated is True
    assert (again.path, again.sha256, again.size) == (first.path, first.sha256, first.size)
    assert (tmp_path / "t-2.md").stat().st_ino == inode  # the same file, not a new one
    assert os.listdir(tmp_path) == ["t-2.md"]


def test_different_content_at_the_name_is_never_overwritten(tmp_path: Path) -> None:
    (tmp_path / "t-2.md").write_bytes(b"someone else's report")
    with pytest.raises(ToolError, match="different content"):
        publish_once(str(tmp_path), "t-2.md", TEXT)
    assert (tmp_path / "t-2.md").read_bytes() == b"someone else's report"
    assert os.listdir(tmp_path) == ["t-2.md"]


def test_a_planted_symlink_is_not_followed(tmp_path: Path) -> None:
    folder = tmp_path / "artifacts"
    folder.mkdir()
    outside = tmp_path / "precious.txt"
    outside.write_bytes(TEXT)  # even the same content must not count as published
    (folder / "t-2.md").symlink_to(outside)
    with pytest.raises(ToolError, match="not a regular file"):
        publish_once(str(folder), "t-2.md", TEXT)
    assert (folder / "t-2.md").is_symlink()
    assert outside.read_bytes() == TEXT
    assert os.listdir(folder) == ["t-2.md"]


def test_a_dangling_symlink_does_not_create_its_target(tmp_path: Path) -> None:
    folder = tmp_path / "artifacts"
    folder.mkdir()
    target = tmp_path / "created-through-link.txt"
    (folder / "t-2.md").symlink_to(target)
    with pytest.raises(ToolError):
        publish_once(str(folder), "t-2.md", TEXT)
    assert not target.exists()
    assert os.listdir(folder) == ["t-2.md"]


def test_a_folder_at_the_name_is_refused(tmp_path: Path) -> None:
    (tmp_path / "t-2.md").mkdir()
    with pytest.raises(ToolError):
        publish_once(str(tmp_path), "t-2.md", TEXT)
    assert os.listdir(tmp_path) == ["t-2.md"]


@pytest.mark.parametrize("name", ["", "a/b.md", "../x.md", ".hidden.md", "a\0b.md"])
def test_unsafe_names_are_refused_before_any_write(tmp_path: Path, name: str) -> None:
    with pytest.raises(ToolError, match="unsafe artifact name"):
        publish_once(str(tmp_path / "artifacts"), name, TEXT)
    assert os.listdir(tmp_path) == []


def test_unsafe_append_is_not_idempotent(tmp_path: Path) -> None:
    # The mechanism of the negative control: two attempts, two copies.
    path = str(tmp_path / "artifacts" / "report.log")
    append_unsafe(path, b"summary\n---\n")
    append_unsafe(path, b"summary\n---\n")
    assert Path(path).read_bytes() == b"summary\n---\n" * 2


def test_temp_names_of_only_that_task() -> None:
    assert is_temp_of("t1", ".t1-2.md.0123456789abcdef.tmp")
    assert is_temp_of("t1", ".t1-10.md.ffffffffffffffff.tmp")
    for other in [
        ".t10-2.md.0123456789abcdef.tmp",  # another task whose id starts the same
        ".t1-2-3.md.0123456789abcdef.tmp",  # task "t1-2", step 3
        ".t1-2.md.0123456789abcdeg.tmp",  # not hex
        ".t1-2.md.0123456789abcde.tmp",  # too short
        "t1-2.md",  # the artifact itself
        ".t1-x.md.0123456789abcdef.tmp",
    ]:
        assert not is_temp_of("t1", other), other
    assert is_temp_of("a.b", ".a.b-0.md.0123456789abcdef.tmp")
    assert not is_temp_of("a.b", ".aXb-0.md.0123456789abcdef.tmp")


def test_remove_orphans_touches_only_the_tasks_own_temp_files(tmp_path: Path) -> None:
    mine = [".t1-2.md.0123456789abcdef.tmp", ".t1-4.md.fedcba9876543210.tmp"]
    others = [".t10-2.md.0123456789abcdef.tmp", ".t2-2.md.0123456789abcdef.tmp", "t1-2.md"]
    for name in mine + others:
        (tmp_path / name).write_text("x")
    assert sorted(remove_orphans(str(tmp_path), "t1")) == sorted(mine)
    assert sorted(os.listdir(tmp_path)) == sorted(others)
    assert remove_orphans(str(tmp_path), "t1") == []


def test_remove_orphans_without_a_folder(tmp_path: Path) -> None:
    assert remove_orphans(str(tmp_path / "missing"), "t1") == []
    (tmp_path / "file").write_text("x")
    assert remove_orphans(str(tmp_path / "file"), "t1") == []


def test_publish_then_orphans_of_a_published_task_are_none(tmp_path: Path) -> None:
    publish_once(str(tmp_path), "t1-2.md", TEXT)
    assert remove_orphans(str(tmp_path), "t1") == []
    assert os.listdir(tmp_path) == ["t1-2.md"]


@pytest.mark.parametrize(
    ("text", "summary"),
    [
        ("Line one\n\n  Line two  \nLine three\nLine four\n", "Line one\nLine two\nLine three"),
        ("only\n", "only"),
        ("\n\n   \n", ""),
        ("", ""),
        ("a\r\nb\r\n\r\nc\r\nd", "a\nb\nc"),
        ("\tx\t\n y \n", "x\ny"),
    ],
)
def test_stub_summary_is_the_first_three_non_empty_stripped_lines(text: str, summary: str) -> None:
    assert stub_summary(text) == summary


def test_unusable_folder_says_why_for_absolute_and_relative_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ninelives.diskio import unusable_folder

    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    (tmp_path / "ok").mkdir()
    for base in ("", f"{tmp_path}/"):
        assert unusable_folder(f"{base}file") == "is not a folder"
        assert unusable_folder(f"{base}fifo") == "is not a folder"
        assert unusable_folder(f"{base}link") == "is a symlink"
        assert unusable_folder(f"{base}ok") is None
        assert unusable_folder(f"{base}ok/new/deeper") is None  # made by the first write
        made_in = unusable_folder(f"{base}file/sub")
        assert made_in == f"cannot be made: {tmp_path}/file is not a folder"


def test_a_name_too_long_for_its_temporary_file_is_refused_before_any_write(
    tmp_path: Path,
) -> None:
    # A name of 234 to 255 bytes is a valid file name, but its temporary file
    # (".NAME.<16 hex>.tmp") is not: the step failed each attempt on a bare
    # OSError "File name too long" naming the temporary file.
    with pytest.raises(ToolError, match="too long"):
        publish_once(str(tmp_path), "n" * 240, b"x")
    assert list(tmp_path.iterdir()) == []
    longest = publish_once(str(tmp_path), "n" * 233, b"x")
    assert Path(longest.path).read_bytes() == b"x"


def test_text_is_refused_with_what_to_do(tmp_path: Path) -> None:
    # hashlib's "Strings must be encoded before hashing" named no fix.
    with pytest.raises(TypeError, match="takes bytes"):
        publish_once(str(tmp_path), "a.md", "text")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
