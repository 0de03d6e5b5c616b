"""The names the docs teach are importable from ``ninelives`` itself."""

from __future__ import annotations

import importlib
import inspect

import pytest

import ninelives
from ninelives import errors

#: Where each lazily loaded public name lives.
HOMES = {
    "Runtime": "ninelives.runtime",
    "Settings": "ninelives.settings",
    "tool": "ninelives.tools",
    "Tool": "ninelives.tools",
    "ToolContext": "ninelives.tools",
    "Registry": "ninelives.tools",
    "default_registry": "ninelives.tools.builtin",
    "publish_once": "ninelives.tools.effects",
    "artifacts_folder": "ninelives.tools.effects",
    "workflow": "ninelives.durable",
    "step": "ninelives.durable",
    "current_step": "ninelives.durable",
}


def test_every_name_in_all_resolves() -> None:
    for name in ninelives.__all__:
        assert getattr(ninelives, name) is not None, name
    assert sorted(ninelives.__all__) == ninelives.__all__
    assert set(ninelives.__all__) <= set(dir(ninelives))


def test_lazy_names_are_the_objects_of_their_home_modules() -> None:
    for name, home in HOMES.items():
        assert name in ninelives.__all__, name
        assert getattr(ninelives, name) is getattr(importlib.import_module(home), name), name


def test_every_error_of_the_tree_is_exported() -> None:
    tree = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, errors.NineLivesError)
    }
    assert len(tree) > 30  # the control: the tree was found
    assert tree - set(ninelives.__all__) == set()


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        ninelives.no_such_name  # noqa: B018
