"""Tools: the protocol every step's tool follows, and the registry that finds them.

A tool is a function of the step's stored JSON ``input`` and a
:class:`ToolContext` (``tool(input, ctx)``: the task id, the step index, the
attempt, the outputs of the done steps, the idempotency key and the model
engine), or in the contract's form ``tool(input, ctx, idem_key)``, where
``ctx`` maps each done step's index to its committed output; ``idem_key`` is
``<task_id>-<step_idx>``, stable across retries and restarts. It returns a
JSON object, committed as the step's output. The executor is
at-least-once: a tool with an outside effect must make it idempotent by
``idem_key`` (see :func:`ninelives.tools.effects.publish_once`).

Custom tools come from other packages through the ``ninelives.tools`` entry
point group (``name = "package.module:tool"``), are registered in code with
:meth:`Registry.register`, or are declared in a module with the :func:`tool`
decorator (or a ``register(registry)`` function in it) and loaded by naming the
module in ``--tools`` / ``NINELIVES_TOOLS`` (:func:`load_tool_modules`), so that
``create``, ``run`` and ``worker`` processes all see them.

A tool may be an ``async def``: each call runs its coroutine to completion
(:mod:`ninelives.tools.coroutines`) and returns its value, so the step machinery,
its timeouts and retries see a plain call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..durable import is_async_def
from ..errors import InputError, PlanError

#: A tool function: ``(input, ctx)`` with a :class:`ToolContext`, or the contract's
#: ``(input, ctx, idem_key)`` with the outputs as ``ctx``.
ToolFn = Callable[..., Mapping[str, Any]]
Validator = Callable[[Mapping[str, Any]], None]

ENTRY_POINT_GROUP = "ninelives.tools"


@dataclass(frozen=True, kw_only=True)
class Tool:
    """A named tool: the function to run, an optional input check run at ``create``,
    and the JSON Schema and description a model is shown.

    ``validate(input)`` raises :class:`~ninelives.errors.PlanError` for input the
    tool can never accept, so a bad plan is refused before anything runs.
    """

    name: str
    #: ``fn(input, ctx, idem_key)``, or ``fn(input, context)`` with ``takes_context``.
    fn: Callable[..., Mapping[str, Any]]
    validate: Validator | None = None
    #: JSON Schema of the input: required for a tool an agent may call, whose
    #: model is shown it and whose calls are checked against it.
    schema: Mapping[str, Any] | None = None
    description: str = ""
    #: True when ``fn`` takes ``(input, ctx)`` with a :class:`ToolContext`.
    takes_context: bool = False
    #: The version the tool declares (any text), journaled in every ``step_started``
    #: so that a replay can tell which version of a tool produced an output.
    version: str | None = None
    #: What a recovery does with a step of this tool found ``running`` (its
    #: outcome unknown): ``rerun`` (at least once: the tool is idempotent),
    #: ``probe`` (ask :attr:`probe`) or ``refuse`` (at most once: park the step
    #: ``blocked`` for ``ninelives resolve``). A plan step's ``on_unknown`` overrides it.
    on_unknown: str = "rerun"
    #: ``probe(ctx)`` or ``probe(input, ctx)``, asked (outside any transaction)
    #: whether the effect of a step left running happened, by ``ctx.idem_key``:
    #: it returns the output (a JSON object) if it did, None if it did not, and
    #: raises (say :class:`~ninelives.errors.ToolError`) when it cannot tell.
    probe: Callable[..., Mapping[str, Any] | None] | None = None

    def __call__(
        self, input: Mapping[str, Any], ctx: Mapping[int, Any], idem_key: str
    ) -> Mapping[str, Any]:
        """Call the tool in the contract's form (a context is made for the other form)."""
        if self.takes_context:
            context = ToolContext(
                task_id=idem_key.rpartition("-")[0],
                step=int(idem_key.rpartition("-")[2]),
                attempt=0,
                outputs=ctx,
                idem_key=idem_key,
            )
            return self.run(input, context)
        return _invoke(self.fn, input, ctx, idem_key)

    def run(self, input: Mapping[str, Any], context: ToolContext) -> Mapping[str, Any]:
        """Call the tool for one attempt of a step (an ``async def`` tool is run to
        completion, see :func:`ninelives.tools.coroutines.run_async`)."""
        if self.takes_context:
            return _invoke(self.fn, input, context)
        return _invoke(self.fn, input, context.outputs, context.idem_key)

    def start(self, input: Mapping[str, Any], context: ToolContext) -> Any:
        """As :meth:`run`, but an ``async def`` tool's coroutine is returned to be
        awaited: an async workflow's ``ctx.call_tool`` runs it on the workflow's own
        loop, where the clients the workflow made are bound."""
        if self.takes_context:
            return self.fn(input, context)
        return self.fn(input, context.outputs, context.idem_key)

    def ask_probe(self, input: Mapping[str, Any], context: ToolContext) -> Mapping[str, Any] | None:
        """Call :attr:`probe` (which must be set) in whichever form it takes."""
        assert self.probe is not None
        if _accepts(self.probe, 2) and not _accepts(self.probe, 1):
            answer = self.probe(input, context)
        else:
            answer = self.probe(context)
        if hasattr(answer, "__await__"):
            close = getattr(answer, "close", None)
            if callable(close):
                close()  # nobody awaits it: Python would warn on stderr
            raise TypeError(
                "the probe returned an awaitable, which is never awaited: "
                "make it a plain def that returns the output or None"
            )
        return answer


@dataclass(frozen=True, kw_only=True)
class ToolContext:
    """What a tool gets besides its input, for one attempt of one step."""

    task_id: str
    step: int
    #: 1 for the first attempt; a recovered or retried step counts on.
    attempt: int
    #: The committed output of each done step, by index.
    outputs: Mapping[int, Any]
    #: ``<task_id>-<step>``: the same for every attempt, to make an effect idempotent.
    idem_key: str
    #: The last progress committed by :meth:`checkpoint` for this step (in this
    #: attempt or an earlier one), or None: where a resumable step carries on.
    progress: Any = None
    #: Commits progress (set by the runtime; None where nothing can be committed).
    saver: Callable[[Any], None] | None = field(default=None, repr=False, compare=False)

    def checkpoint(self, progress: Any) -> None:
        """Commit ``progress`` (any JSON) inside the step, journaled ``step_progress``
        in the same transaction; the next attempt of the step gets it as
        :attr:`progress`.

        Checked like an output (standard JSON, the maximum output size):
        :class:`~ninelives.errors.OutputRefused` otherwise. Fenced like every
        write: a runner that lost the task raises
        :class:`~ninelives.errors.LeaseLost` and commits nothing.
        """
        if self.saver is None:
            raise RuntimeError("this context has no store to checkpoint to")
        self.saver(progress)
        # Frozen for the tool; only a committed checkpoint moves it.
        object.__setattr__(self, "progress", progress)

    def engine(self, **overrides: str) -> Any:
        """The model engine configured by ``NINELIVES_LLM*`` (``engine=``, ``model=``
        override it), for a tool that calls a model itself."""
        from ..llm import EngineConfig, open_engine

        return open_engine(EngineConfig.from_env(None, **overrides))


def _invoke(fn: Callable[..., Any], *args: Any) -> Mapping[str, Any]:
    """``fn(*args)``; an ``async def`` run to completion (asyncio loads only then).
    What it returned is checked as an output by the caller, whatever it is."""
    if not is_async_def(fn):
        returned: Mapping[str, Any] = fn(*args)
        return returned
    from .coroutines import run_async

    awaited: Mapping[str, Any] = run_async(fn, *args)
    return awaited


def _takes_context(fn: Callable[..., Any]) -> bool:
    """The ``(input, ctx)`` form: two arguments, and not the contract's three."""
    return _accepts(fn, 2) is True and not _accepts(fn, 3)


def _accepts(fn: object, count: int) -> bool | None:
    """Whether ``fn`` takes ``count`` positional arguments (a method's ``self``
    aside, defaults counted); None when its code does not say (``*args``, a
    ``functools.partial``, an object with ``__call__``): it is called as given."""
    code = getattr(fn, "__code__", None)
    if code is None or code.co_flags & 0x04:  # inspect.CO_VARARGS, without inspect's import
        return None
    most = int(code.co_argcount) - (getattr(fn, "__self__", None) is not None)
    least = most - len(getattr(fn, "__defaults__", None) or ())
    return least <= count <= most


#: The modes of :attr:`Tool.on_unknown` (as ``on_unknown`` in a plan step).
ON_UNKNOWN = ("rerun", "probe", "refuse")


def check_declared(name: object, fn: object, version: object = None) -> None:
    """Refuse a tool declared with a name that is not text (or empty), a function
    that is not callable, or a version that is not text (:class:`PlanError`):
    each would otherwise fail far from here, as a tool no plan can name or a step
    failing its attempts."""
    if not isinstance(name, str) or not name:
        raise PlanError(f"a tool's name must be non-empty text, got {name!r}")
    if not callable(fn):
        raise PlanError(f"tool {name!r}: {fn!r} is not callable")
    if _accepts(fn, 2) is False and _accepts(fn, 3) is False:
        raise PlanError(f"tool {name!r} must take (input, ctx) or (input, ctx, idem_key)")
    if version is not None and not isinstance(version, str):
        raise PlanError(f"tool {name!r}: version must be a string, got {version!r}")


def check_on_unknown(name: str, on_unknown: str, probe: object) -> None:
    """Refuse a tool declared with a mode that is not one of :data:`ON_UNKNOWN`,
    or with ``probe`` mode and no probe (:class:`~ninelives.errors.PlanError`)."""
    if on_unknown not in ON_UNKNOWN:
        raise PlanError(
            f"tool {name!r}: on_unknown must be one of {', '.join(ON_UNKNOWN)}, got {on_unknown!r}"
        )
    if on_unknown == "probe" and probe is None:
        raise PlanError(f"tool {name!r}: on_unknown 'probe' needs a probe")
    if is_async_def(probe):
        # Asked outside any event loop: its coroutine would never run, and
        # would be taken for its answer.
        raise PlanError(f"tool {name!r}: its probe must be a plain def, not an async def")


class Registry:
    """Tools by name. Unknown names are looked up once in the entry point group."""

    def __init__(self, tools: Iterable[Tool] = (), *, entry_points: bool = True) -> None:
        self._tools = {tool.name: tool for tool in tools}
        self._entry_points = entry_points

    def register(
        self, name: str, fn: ToolFn | None = None, *, validate: Validator | None = None
    ) -> Any:
        """Register ``fn`` (either form of :data:`ToolFn`) as tool ``name``; without
        ``fn``, return a decorator. :class:`PlanError` if it is declared wrong
        (:func:`check_declared`)."""
        if fn is None:

            def decorator(func: ToolFn) -> ToolFn:
                self.register(name, func, validate=validate)
                return func

            return decorator
        check_declared(name, fn)
        made = Tool(name=name, fn=fn, validate=validate, takes_context=_takes_context(fn))
        self._tools[name] = made
        return made

    def add(self, tool: Tool) -> Tool:
        """Register ``tool`` under its own name (replacing one of that name); return it."""
        self._tools[tool.name] = tool
        return tool

    def lookup(self, name: str) -> Tool:
        """The tool called ``name``; :class:`PlanError` if no tool has that name, or if
        the installed entry point that names it cannot be loaded."""
        tool = self._tools.get(name)
        if tool is None and self._entry_points:
            tool = self._load_entry_point(name)
        if tool is None:
            known = ", ".join(sorted(self._tools))
            raise PlanError(f"unknown tool {name!r} (known: {known})")
        return tool

    def names(self) -> list[str]:
        """Names of the tools registered so far (entry points load on first use)."""
        return sorted(self._tools)

    def _load_entry_point(self, name: str) -> Tool | None:
        # importlib.metadata costs ~15 ms to import: only pay it for a name
        # that no built-in or registered tool answers.
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name == name:
                try:
                    loaded = ep.load()
                except KeyboardInterrupt:
                    raise  # a Ctrl-C while it loads: an interruption, as anywhere
                except BaseException as exc:  # its import or name is broken
                    from ..journal import error_text

                    # A PlanError, as for a tool not installed: refused before any claim.
                    raise PlanError(
                        f"tool {name!r}, whose entry point {ep.value!r} cannot load: "
                        f"{error_text(exc)}"
                    ) from exc
                tool = (
                    loaded
                    if isinstance(loaded, Tool)
                    else Tool(name=name, fn=loaded, takes_context=_takes_context(loaded))
                )
                self._tools[name] = tool
                return tool
        return None


#: Tools declared with :func:`tool`, by the module that declared them.
_DECLARED: dict[str, dict[str, Tool]] = {}


def tool(
    name: str | None = None,
    *,
    schema: Mapping[str, Any] | None = None,
    description: str = "",
    validate: Validator | None = None,
    version: str | None = None,
    on_unknown: str = "rerun",
    probe: Callable[..., Mapping[str, Any] | None] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare the decorated function as tool ``name`` (default: its own name).

    The function takes ``(input, ctx)`` with a :class:`ToolContext`, or the
    contract's ``(input, ctx, idem_key)``, and may be an ``async def`` (run to
    completion on each call). ``schema`` (JSON Schema of the
    input) lets agents call it: the model is shown it and ``description`` (by
    default the function's docstring), and every call is checked against it.
    ``version`` (say ``"2"`` after a fix) is journaled in each ``step_started``
    of the tool, beside the ninelives version.

    Declaring registers nothing by itself: a registry gets the tools of a module
    when the module is named in ``--tools`` or ``NINELIVES_TOOLS``
    (:func:`load_tool_modules`).

    ``on_unknown`` and ``probe`` say what a recovery does with a step left
    ``running`` (see :attr:`Tool.on_unknown`); ``probe`` mode needs a probe.
    ::

        # mypkg/tools.py; run with: ninelives --tools mypkg.tools run TASK
        from ninelives.tools import tool

        @tool("shout")
        def shout(step_input, ctx, idem_key):
            return {"text": ctx[step_input["from"]]["summary"].upper()}
    """

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        declared = str(getattr(fn, "__name__", "")) if name is None else name
        check_declared(declared, fn, version)
        check_on_unknown(declared, on_unknown, probe)
        module = getattr(fn, "__module__", "") or ""
        _DECLARED.setdefault(module, {})[declared] = Tool(
            name=declared,
            fn=fn,
            validate=validate,
            schema=schema,
            description=description or " ".join((fn.__doc__ or "").split()),
            takes_context=_takes_context(fn),
            version=version,
            on_unknown=on_unknown,
            probe=probe,
        )
        return fn

    return decorator


def load_tool_modules(registry: Registry, modules: Iterable[str]) -> Registry:
    """Import each module and add its tools to ``registry``; return ``registry``.

    A module's tools are those it (or a module inside its package) declared
    with :func:`tool`, and whatever its ``register(registry)`` function, if it
    has one, registers. Modules are found on ``sys.path`` and then in the working
    directory. A module that cannot be imported, or whose ``register`` raises,
    is an :class:`~ninelives.errors.InputError` naming it.
    """
    import importlib
    import os
    import sys

    # As `python -m` would: a module file in the working directory is found too
    # (after installed packages, which keep precedence).
    here = os.getcwd()
    if here not in sys.path:
        sys.path.append(here)
    # A module's own sys.exit (a script's argparse at import, say) is its failure
    # to load too: it would end the command silently with its code, 0 reading as
    # "done" for a task not even claimed, 3 as "busy". So is any other
    # BaseException it raises (GeneratorExit, a library's own), which would read
    # as a step's. Only KeyboardInterrupt goes on: a Ctrl-C during a slow import
    # raises it there too, and no handler can tell the two apart.
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            from ..journal import error_text

            raise InputError(
                f"cannot load tools from module {module_name!r}: {error_text(exc)}"
            ) from exc
        for declared_in, tools in list(_DECLARED.items()):
            if declared_in == module_name or declared_in.startswith(module_name + "."):
                for declared in tools.values():
                    registry.add(declared)
        register = getattr(module, "register", None)
        if callable(register):
            try:
                register(registry)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # its own code: as if its import failed
                from ..journal import error_text

                raise InputError(
                    f"cannot load tools from module {module_name!r}: its register() "
                    f"raised {error_text(exc)}"
                ) from exc
    return registry
