"""The pure parts of ninelives.blobs: what a reference is, the escape, the settings."""

from __future__ import annotations

import json

import pytest

from ninelives.blobs import BlobRef, escape, needs_escape, nested_refs, parse_ref, row_ref
from ninelives.errors import InputError
from ninelives.journal import dumps
from ninelives.settings import Settings

HEX = "ab" * 32


def test_a_reference_is_exactly_its_shape() -> None:
    ref = BlobRef(HEX, 10)
    assert parse_ref(ref.as_json()) == ref
    assert row_ref(dumps(ref.as_json())) == ref
    for value in (
        {"$blob": {"sha256": HEX, "size": 10, "more": 1}},  # an extra key
        {"$blob": {"sha256": HEX.upper(), "size": 10}},  # not lowercase hex
        {"$blob": {"sha256": HEX[:-1], "size": 10}},  # too short
        {"$blob": {"sha256": "../" + HEX[3:], "size": 10}},  # never a path
        {"$blob": {"sha256": HEX, "size": -1}},
        {"$blob": {"sha256": HEX, "size": True}},
        {"$blob": {"sha256": HEX, "size": 1.0}},
        {"$blob": {"sha256": HEX, "size": 10}, "text": "x"},  # a second key
        {"$blob": [HEX, 10]},
    ):
        assert parse_ref(value) is None, value
        assert row_ref(json.dumps(value, separators=(",", ":"))) is None, value
    assert row_ref('{"text": "no"}') is None
    assert row_ref(None) is None


def test_outputs_that_could_be_read_as_references_are_escaped() -> None:
    assert needs_escape({"$blob": 1})
    assert needs_escape({"$raw": {}})
    assert not needs_escape({"$blob": 1, "other": 2})
    assert not needs_escape({"text": "x"})
    wrapped = escape(dumps({"$blob": 1}))
    assert json.loads(wrapped) == {"$raw": {"$blob": 1}}
    assert wrapped == dumps({"$raw": {"$blob": 1}})  # canonical, like every stored output


def test_nested_references_are_found_anywhere() -> None:
    ref = BlobRef(HEX, 3)
    value = {"a": [1, {"b": ref.as_json()}], "c": ref.as_json(), "d": {"$blob": "no"}}
    assert list(nested_refs(value)) == [ref, ref]


def test_the_settings_of_large_outputs() -> None:
    # Off by default: the contract's steps.output holds the output itself.
    assert Settings.from_env({}).blob_threshold > Settings.from_env({}).max_output
    assert Settings.from_env({}).blob_threshold >= 512 * 1024 * 1024
    assert Settings.from_env({}).max_fetch == 1 << 30
    assert Settings.from_env({"NINELIVES_BLOB_THRESHOLD": "0"}).blob_threshold == 0
    for name, value in [
        ("NINELIVES_BLOB_THRESHOLD", "-1"),
        ("NINELIVES_BLOB_THRESHOLD", "lots"),
        ("NINELIVES_BLOB_THRESHOLD", "nan"),
        ("NINELIVES_MAX_FETCH", "0"),
        ("NINELIVES_MAX_FETCH", "1e3"),
    ]:
        with pytest.raises(InputError, match=name):
            Settings.from_env({name: value})
