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
        """Call every implementation (an observer hook); results are ignored.

        What an implementation raises is logged, and the next one is called.
        """
        entries = self._current()
        if self._use_pluggy:
            observe(self._caller, **kwargs)
            return
        for function, names in entries:
            try:
                function(*[kwargs[name] for name in names])
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
