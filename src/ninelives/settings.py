"""Runtime settings, read once from the ``AGENT_*`` environment of the contract."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import NamedTuple, TypeVar

from . import crashpoints
from .errors import InputError

T = TypeVar("T", int, float)

#: The default ``NINELIVES_BLOB_THRESHOLD``: more than any output can be
#: (``NINELIVES_MAX_OUTPUT`` is at most 512 MiB), so that every output stays in
#: its ``steps.output`` row, where the contract's users read it with SQL, unless
#: a threshold is given.
BLOB_THRESHOLD_OFF = 1 << 40
#: The largest ``NINELIVES_BACKOFF`` (and the default cap of every wait, in seconds).
BACKOFF_CAP = 30.0

#: Each number of :class:`Settings`: its variable, type and range, the one rule
#: that :meth:`Settings.from_env` reads a variable by and :meth:`Settings.checked`
#: checks a value given in code by.
NUMBERS: dict[str, tuple[str, type[int] | type[float], float, float | None]] = {
    "max_attempts": ("AGENT_MAX_ATTEMPTS", int, 1, None),
    # time.sleep() overflows past ~2**63 ns: a day is plenty for any test.
    "step_delay": ("AGENT_STEP_DELAY", float, 0, 86400),
    "max_recoveries": ("NINELIVES_MAX_RECOVERIES", int, 0, None),
    # SQLite refuses a value over 1e9 bytes by default; half of that leaves
    # room for the row and for a reader's copy in memory.
    "max_output": ("NINELIVES_MAX_OUTPUT", int, 1024, 512 * 1024 * 1024),
    "backoff": ("NINELIVES_BACKOFF", float, 0, BACKOFF_CAP),
    "blob_threshold": ("NINELIVES_BLOB_THRESHOLD", int, 0, BLOB_THRESHOLD_OFF),
    "max_fetch": ("NINELIVES_MAX_FETCH", int, 1, 1 << 40),
    "llm_timeout": ("NINELIVES_LLM_TIMEOUT", float, 0.1, 86400),
}


class Settings(NamedTuple):
    """Everything the runtime and the built-in tools read from the environment."""

    max_attempts: int = 3
    step_delay: float = 0.0
    artifacts: str = "artifacts"
    unsafe_effects: bool = False
    llm: str = "stub"
    ollama_url: str = "http://127.0.0.1:11434"
    ollama_model: str = "llama3.2"
    workspace: str = "."
    #: Times one step may be found ``running`` after its process died (crash, OOM,
    #: kill) and be run again before the task fails (``NINELIVES_MAX_RECOVERIES``).
    max_recoveries: int = 5
    #: Largest step output stored, in bytes of JSON (``NINELIVES_MAX_OUTPUT``).
    max_output: int = 64 * 1024 * 1024
    #: The backoff base: about this many seconds before a failed step's second
    #: attempt, doubled for each later one, with jitter, capped at 30 s
    #: (:mod:`ninelives.policy`); a step's ``backoff`` policy overrides it; 0
    #: turns every wait off, the plans' too (``NINELIVES_BACKOFF``).
    backoff: float = 0.5
    #: Modules that register tools, imported by the tool registry (``NINELIVES_TOOLS``).
    tool_modules: tuple[str, ...] = ()
    #: Outputs over this many bytes of JSON are stored as blobs, out of the row
    #: (``NINELIVES_BLOB_THRESHOLD``; see :mod:`ninelives.blobs`); by default none.
    blob_threshold: int = BLOB_THRESHOLD_OFF
    #: Largest file ``fetch`` reads; one over ``MAX_FETCH_BYTES`` is streamed to
    #: the blob store instead of held in memory (``NINELIVES_MAX_FETCH``).
    max_fetch: int = 1 << 30
    #: Seconds for a whole exchange with a model server, ``summarize``'s Ollama
    #: path as the engines' (``NINELIVES_LLM_TIMEOUT``; :mod:`ninelives.llm`).
    llm_timeout: float = 120.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read the contract's variables; a malformed value is an :class:`InputError`."""
        env = os.environ if env is None else env
        crash_at = env.get("AGENT_CRASH_AT", "")
        if crash_at:
            try:
                crashpoints.parse(crash_at)
            except ValueError as exc:
                raise InputError(f"AGENT_CRASH_AT: {exc}") from None
        numbers = {
            field: env_number(env, name, cls._field_defaults[field], kind, minimum, maximum)
            for field, (name, kind, minimum, maximum) in NUMBERS.items()
        }
        return cls(
            artifacts=env.get("AGENT_ARTIFACTS") or "artifacts",
            unsafe_effects=env.get("AGENT_UNSAFE_EFFECTS", "") not in ("", "0"),
            llm=env.get("AGENT_LLM") or "stub",
            ollama_url=env.get("OLLAMA_URL") or "http://127.0.0.1:11434",
            ollama_model=env.get("OLLAMA_MODEL") or "llama3.2",
            workspace=env.get("NINELIVES_WORKSPACE") or ".",
            tool_modules=parse_tool_modules(env.get("NINELIVES_TOOLS", "")),
            **numbers,
        )

    def checked(self) -> Settings:
        """These settings, if every value is one :meth:`from_env` could have read
        (a number in its variable's range, a folder named); else an
        :class:`InputError` naming the field. The runtime checks settings given
        in code before it opens anything: a negative delay or an empty artifacts
        folder failed in the middle of a step before."""
        for field, (name, kind, minimum, maximum) in NUMBERS.items():
            value = getattr(self, field)
            number = not isinstance(value, bool) and isinstance(
                value, (int, float) if kind is float else int
            )
            # NaN compares false with everything: test the accepted range.
            if not (number and minimum <= value and (maximum is None or value <= maximum)):
                span = f"at least {minimum}" if maximum is None else f"{minimum} to {maximum}"
                what = "an integer" if kind is int else "a number"
                raise InputError(
                    f"Settings.{field} must be {what}, {span} (as {name}), got {value!r}"
                )
        for field in ("artifacts", "workspace"):
            folder = getattr(self, field)
            if not isinstance(folder, str) or not folder:
                raise InputError(f"Settings.{field} must name a folder, got {folder!r}")
        return self


def parse_tool_modules(text: str) -> tuple[str, ...]:
    """``"a.b, c"`` -> ``("a.b", "c")``: the comma-separated module names of
    ``--tools`` and ``NINELIVES_TOOLS``; an :class:`InputError` for a bad name."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    for name in names:
        if not all(piece.isidentifier() for piece in name.split(".")):
            raise InputError(f"tool module {name!r} is not a module name (like 'mypkg.tools')")
    return names


def env_number(
    env: Mapping[str, str],
    name: str,
    default: T,
    kind: Callable[[str], T],
    minimum: float,
    maximum: float | None = None,
) -> T:
    """``env[name]`` read as ``kind`` (``int`` or ``float``), or ``default`` when it
    is unset or empty; in ``minimum``..``maximum`` (NaN is in no range).

    The one rule for a number in a variable: ASCII, no ``_``, no padding. Else an
    :class:`InputError` naming the variable, which the command reports as exit 4.
    """
    raw = env.get(name, "")
    if not raw:
        return default
    try:
        # int() and float() also take "3_0" (30), other scripts' digits and
        # padding: none of them is how a number is written into a variable.
        if not raw.isascii() or "_" in raw or raw != raw.strip():
            raise ValueError(raw)
        value = kind(raw)
    except ValueError:
        raise InputError(f"{name} must be a number, got {raw!r}") from None
    # NaN compares false with everything, so test the accepted range, not the refused one.
    if not value >= minimum:
        raise InputError(f"{name} must be at least {minimum}, got {raw!r}")
    if maximum is not None and not value <= maximum:
        raise InputError(f"{name} must be at most {maximum}, got {raw!r}")
    return value
