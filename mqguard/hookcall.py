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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pluggy

_Entry = tuple[Callable[..., Any], Sequence[str]]


class HotCall:
    """A fast caller for one hook; ``first`` for firstresult hooks, ``each`` for observers."""

    __slots__ = ("_caller", "_entries", "_impls", "_use_pluggy")

    def __init__(self, caller: pluggy.HookCaller) -> None:
        self._caller = caller
        self._impls: list[pluggy.HookImpl] = []
        self._entries: tuple[_Entry, ...] = ()
        self._use_pluggy = False

    def _current(self) -> tuple[_Entry, ...]:
        impls = self._caller.get_hookimpls()
        if impls != self._impls:  # HookImpl compares by identity
            self._impls = impls
            self._use_pluggy = any(impl.hookwrapper or impl.wrapper for impl in impls)
            self._entries = tuple((impl.function, tuple(impl.argnames))
                                  for impl in reversed(impls))
        return self._entries

    def __bool__(self) -> bool:
        """True when some plugin implements the hook."""
        return bool(self._current())

    def first(self, **kwargs: Any) -> Any:
        """Call until an implementation returns something other than None; return that."""
        entries = self._current()
        if self._use_pluggy:
            return self._caller(**kwargs)
        for function, names in entries:
            result = function(*[kwargs[name] for name in names])
            if result is not None:
                return result
        return None

    def each(self, **kwargs: Any) -> None:
        """Call every implementation (an observer hook); results are ignored."""
        entries = self._current()
        if self._use_pluggy:
            self._caller(**kwargs)
            return
        for function, names in entries:
            function(*[kwargs[name] for name in names])
