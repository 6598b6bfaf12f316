"""Calling hooks on the per-message paths with less overhead than pluggy's generic call.

A pluggy ``HookCaller`` call costs about 4 us here (argument checks, the
multicall loop, result collection), and the deliver path calls three hooks per
message: more than the guard's own work. :class:`HotCall` keeps, per hook, the
implementations' functions and argument names, rebuilt whenever the set of
implementations changes, and calls them directly in pluggy's order: ~1 us.

Semantics are pluggy's: implementations are called last-registered first,
``tryfirst``/``trylast`` respected (``get_hookimpls()`` lists them in reverse
call order), each with the subset of arguments it asks for; a firstresult
call stops at the first non-None result; exceptions propagate. A hook with a
wrapper implementation (old- or new-style) goes through pluggy itself.

Observer hooks are the exception to pluggy's semantics: :meth:`HotCall.each` and
:func:`observe` log what an implementation raises and go on (see the hookspecs'
module docstring for why).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import pluggy

log = logging.getLogger("mqguard.plugins")

# An implementation's function, and the positions of the arguments it takes among the
# hookspec's (None: all of them, in the spec's order: the common case, called as is).
_Entry = tuple[Callable[..., Any], tuple[int, ...] | None]


class HotCall:
    """A fast caller for one hook; ``first`` for firstresult hooks, ``each`` for observers.

    Arguments are positional, in the hookspec's order (``first(message, ctx)`` for
    ``before_deliver(message, ctx)``): no keyword dict per call, and an implementation
    that takes all the spec's arguments in its order gets them as they are.
    """

    __slots__ = ("_caller", "_entries", "_generation", "_impls", "_manager", "_names",
                 "_use_pluggy")

    def __init__(self, caller: pluggy.HookCaller, manager: object | None = None) -> None:
        if caller.spec is None:
            raise ValueError(f"hook {caller.name} has no hookspec: HotCall needs its arguments")
        self._caller = caller
        self._names: tuple[str, ...] = tuple(caller.spec.argnames)
        # A manager that counts its changes (GuardPluginManager.generation) spares the
        # copy and comparison of the implementation list on every call.
        self._manager = manager if hasattr(manager, "generation") else None
        self._generation = -1
        self._impls: list[pluggy.HookImpl] = []
        self._entries: tuple[_Entry, ...] = ()
        self._use_pluggy = False

    def _current(self) -> tuple[_Entry, ...]:
        manager = self._manager
        if manager is not None:
            generation: int = manager.generation  # type: ignore[attr-defined]
            if generation == self._generation:
                return self._entries
            self._generation = generation
        impls = self._caller.get_hookimpls()
        if impls != self._impls:  # HookImpl compares by identity
            self._impls = impls
            self._use_pluggy = any(impl.hookwrapper or impl.wrapper for impl in impls)
            self._entries = tuple((impl.function, self._positions(impl.argnames))
                                  for impl in reversed(impls))
        return self._entries

    def _positions(self, argnames: Sequence[str]) -> tuple[int, ...] | None:
        if tuple(argnames) == self._names:
            return None
        return tuple(self._names.index(name) for name in argnames)

    def __bool__(self) -> bool:
        """True when some plugin implements the hook."""
        return bool(self._current())

    def first(self, *args: Any) -> Any:
        """Call until an implementation returns something other than None; return that."""
        entries = self._current()
        if self._use_pluggy:
            return self._caller(**dict(zip(self._names, args, strict=True)))
        for function, positions in entries:
            result = (function(*args) if positions is None
                      else function(*[args[index] for index in positions]))
            if result is not None:
                return result
        return None

    def each(self, *args: Any) -> None:
        """Call every implementation (an observer hook); results are ignored.

        What an implementation raises is logged, and the next one is called.
        """
        entries = self._current()
        if self._use_pluggy:
            observe(self._caller, **dict(zip(self._names, args, strict=True)))
            return
        for function, positions in entries:
            try:
                if positions is None:
                    function(*args)
                else:
                    function(*[args[index] for index in positions])
            except Exception:
                _log_failure(self._caller.name, function)


def observe(caller: pluggy.HookCaller, **kwargs: Any) -> None:
    """Call an observer hook through pluggy, if implemented; log what it raises.

    Skipped when nothing implements it: pluggy's call machinery costs
    microseconds even then, and the deliver path calls several observers per
    message. Through pluggy an exception ends the call, so implementations after
    the failing one are not called (hooks with wrappers only; others use HotCall).
    """
    if not caller.get_hookimpls():
        return
    try:
        caller(**kwargs)
    except Exception:
        _log_failure(caller.name, None)


def _log_failure(hook: str, function: Callable[..., Any] | None) -> None:
    where = f"{function.__module__}.{function.__qualname__}" if function is not None else hook
    log.exception("observer %s failed in %s; the message's fate is unchanged", hook, where)
