"""Durable agents written with the frameworks people use.

* :mod:`ninelives.integrations.pydantic_ai`: ``NinelivesDurability``, a Pydantic AI
  capability (``pip install 'ninelives[pydantic-ai]'``);
* :mod:`ninelives.integrations.openai_agents`: ``durable(agent)`` for the OpenAI
  Agents SDK (``pip install 'ninelives[openai-agents]'``).

Inside a ninelives workflow every model request and every function-tool call
of such an agent is a durable step; outside one the agent runs as it always
does. Neither ``import ninelives`` nor the command line imports a framework:
only importing one of these modules does, and it first checks that the
installed version lies in the range the module is tested with.
"""

from __future__ import annotations

from importlib import metadata

from ..errors import InputError

__all__ = ["FrameworkVersionError", "require"]


class FrameworkVersionError(InputError, ImportError):
    """The installed framework is missing or outside the range this module is tested with."""


def require(distribution: str, lowest: str, below: str, extra: str) -> str:
    """The installed version of ``distribution``, checked to be ``>= lowest`` and
    ``< below`` (plain dotted release numbers); :class:`FrameworkVersionError` naming
    the range and the extra to install otherwise."""
    wanted = f"{distribution}>={lowest},<{below}"
    try:
        found = metadata.version(distribution)
    except metadata.PackageNotFoundError:
        raise FrameworkVersionError(
            f"{distribution} is not installed: pip install 'ninelives[{extra}]' ({wanted})"
        ) from None
    release = _release(found)
    low, high = _release(lowest), _release(below)
    assert low is not None
    assert high is not None
    if release is None or not low <= release < high:
        raise FrameworkVersionError(
            f"ninelives supports {wanted}, found {distribution} {found}: a replay journaled "
            f"by another version may not read back the same; pip install 'ninelives[{extra}]'"
        )
    return found


def _release(version: str) -> tuple[int, ...] | None:
    """The release numbers of ``version``, padded to three (``2.68`` -> (2, 68, 0);
    ``2.68.0rc1`` -> (2, 68, 0)), or None when it does not start with a number."""
    import re

    match = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", version)
    if match is None:
        return None
    return tuple(int(part or 0) for part in match.groups())
