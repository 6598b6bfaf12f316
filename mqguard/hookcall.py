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

Observer hooks are the exception to pluggy's semantics: :meth:`HotCall.each`,
:meth:`BatchCall.each` and :func:`observe` log what an implementation raises (with
the hook's and the plugin's names) and call the next one, on every path, wrappers
included (see the hookspecs' module docstring for why). Like dramatiq's
``Broker.emit_after``, the isolation is per implementation: pluggy's own call
loop ends at the first exception, so it never runs an observer's implementations
unguarded.
"""

from __future__ import annotations

import copy
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
            generation: int = manager.generation
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
                _log_failure(self._caller.name, function, self._impls)


def observe(caller: pluggy.HookCaller, **kwargs: Any) -> None:
    """Call every implementation of an observer hook; log what one raises and go on.

    Skipped when nothing implements it: pluggy's call machinery costs
    microseconds even then, and the deliver path calls several observers per
    message. Without wrappers the implementations are called here, in pluggy's
    order (last registered first, ``tryfirst``/``trylast`` respected), each with
    the arguments it names. With wrappers the call goes through pluggy (so the
    wrappers see it, and hook-call monitoring too), but each plain implementation
    is replaced by a copy whose function logs and swallows what it raises: the
    wrappers see a normal call, and the implementations after a failing one still
    run. What a wrapper itself raises is logged too.

    A missing argument is a bug of the caller, not of a plugin: it raises.
    """
    impls = caller.get_hookimpls()
    if not impls:
        return
    if not any(impl.wrapper or impl.hookwrapper for impl in impls):
        for impl in reversed(impls):  # get_hookimpls() lists them in reverse call order
            args = [kwargs[name] for name in impl.argnames]
            try:
                impl.function(*args)
            except Exception:
                _log_failure(caller.name, impl.function, impls)
        return
    for name in caller.spec.argnames if caller.spec is not None else ():
        if name not in kwargs:
            raise TypeError(f"hook {caller.name} called without argument {name!r}")
    isolated = [impl if impl.wrapper or impl.hookwrapper else _isolated(caller.name, impl)
                for impl in impls]
    try:
        # HookCaller.__call__ would take the registered implementations; _hookexec is the
        # manager's entry point for a given list (pluggy's own call_extra uses it).
        caller._hookexec(caller.name, isolated, kwargs, False)
    except Exception:
        wrappers = [impl for impl in impls if impl.wrapper or impl.hookwrapper]
        _log_failure(caller.name, None, wrappers)


def _isolated(hook: str, impl: pluggy.HookImpl) -> pluggy.HookImpl:
    """A copy of ``impl`` whose function logs what the original raises and returns None."""
    function = impl.function

    def call(*args: Any) -> None:
        try:
            function(*args)
        except Exception:
            _log_failure(hook, function, [impl])

    clone = copy.copy(impl)
    # HookImpl's attributes are Final for plugins; the copy is private to this call.
    object.__setattr__(clone, "function", call)
    return clone


def _log_failure(hook: str, function: Callable[..., Any] | None,
                 impls: Sequence[pluggy.HookImpl] = ()) -> None:
    """Log an observer's exception with the hook's name, the plugin's name and the function.

    ``function`` None: a wrapper (one of ``impls``) or pluggy's call itself raised.
    """
    if function is None:
        plugins = ", ".join(sorted({impl.plugin_name for impl in impls})) or "?"
        log.exception("observer %s failed in a wrapper of plugin(s) %s; the message's fate "
                      "is unchanged", hook, plugins)
        return
    plugin = next((impl.plugin_name for impl in impls if impl.function is function), "?")
    where = f"{function.__module__}.{function.__qualname__}"
    log.exception("observer %s failed in plugin %s (%s); the message's fate is unchanged",
                  hook, plugin, where)


# One step of a batch call: an implementation's function, True when it is a batch twin
# (called once with the lists) rather than a per-message hook (called per message), and
# its argument positions as in _Entry.
_Step = tuple[Callable[..., Any], bool, tuple[int, ...] | None]


class BatchCall:
    """Calls a per-message hook over a batch: each plugin's batch twin once, the others'
    per-message implementation once per message, in the per-message hook's plugin order.

    ``single`` is the per-message hook (``before_deliver(message, ctx)``), ``batch`` its
    twin (``before_deliver_batch(messages, contexts)``); the twin's first two arguments
    are the lists of the per-message hook's first two, the rest are the same. A twin
    stands in for its own plugin's per-message implementation, identified by the plugin
    object; a twin whose plugin has no per-message implementation is ignored (and
    reported by :func:`orphan_twins`). Wrapper implementations on either hook make every
    call go per message, through :class:`HotCall` (so through pluggy).
    """

    __slots__ = ("_batch", "_complete", "_generation", "_impls", "_manager", "_names",
                 "_per_message", "_single", "_single_names", "_steps")

    def __init__(self, single: pluggy.HookCaller, batch: pluggy.HookCaller,
                 manager: object | None = None) -> None:
        if single.spec is None or batch.spec is None:
            raise ValueError(f"hook {single.name}/{batch.name} has no hookspec")
        self._single = HotCall(single, manager)
        self._batch = batch
        self._single_names = tuple(single.spec.argnames)
        self._names = tuple(batch.spec.argnames)
        self._manager = manager if hasattr(manager, "generation") else None
        self._generation = -1
        self._impls: tuple[list[pluggy.HookImpl], list[pluggy.HookImpl]] = ([], [])
        self._steps: tuple[_Step, ...] = ()
        self._complete = False
        self._per_message = False

    def _current(self) -> tuple[_Step, ...]:
        # The generation check is HotCall._current's, inlined in both: it runs on every
        # hook call, where a shared helper's extra call costs more than it saves.
        manager = self._manager
        if manager is not None:
            generation: int = manager.generation
            if generation == self._generation:
                return self._steps
            self._generation = generation
        singles = self._single._caller.get_hookimpls()
        twins = self._batch.get_hookimpls()
        if (singles, twins) != self._impls:
            self._impls = (singles, twins)
            self._rebuild(singles, twins)
        return self._steps

    def _rebuild(self, singles: list[pluggy.HookImpl], twins: list[pluggy.HookImpl]) -> None:
        self._per_message = any(impl.hookwrapper or impl.wrapper for impl in (*singles, *twins))
        by_plugin = {id(impl.plugin): impl for impl in twins}
        steps: list[_Step] = []
        complete = True
        for impl in reversed(singles):  # pluggy's call order
            twin = by_plugin.get(id(impl.plugin))
            if twin is not None:
                steps.append((twin.function, True, _positions(twin.argnames, self._names)))
            else:
                complete = False
                steps.append((impl.function, False,
                              _positions(impl.argnames, self._single_names)))
        self._steps = tuple(steps)
        self._complete = complete and not self._per_message

    def __bool__(self) -> bool:
        """True when some plugin implements the per-message hook."""
        return bool(self._current())

    def covered(self) -> bool:
        """True when every per-message implementation has a batch twin (and none is a
        wrapper): a batch decision then calls plugins only through their twins."""
        self._current()
        return self._complete

    def decide(self, messages: list[Any], contexts: list[Any]) -> dict[int, Any]:
        """A firstresult hook over a batch (:meth:`covered` must be True): each plugin's
        twin with the messages no earlier plugin decided; ``{index: result}`` of the
        non-None answers. Exceptions propagate."""
        decided: dict[int, Any] = {}
        undecided = list(range(len(messages)))
        for function, _, positions in self._current():
            if not undecided:
                break
            if len(undecided) == len(messages):
                subset, sub_contexts = messages, contexts
            else:
                subset = [messages[index] for index in undecided]
                sub_contexts = [contexts[index] for index in undecided]
            answer = (function(subset, sub_contexts) if positions is None
                      else function(*[(subset, sub_contexts)[index] for index in positions]))
            if not answer:
                continue
            for local, result in answer.items():
                if result is not None and 0 <= local < len(undecided):
                    decided[undecided[local]] = result
            undecided = [index for index in undecided if index not in decided]
        return decided

    def each(self, messages: list[Any], contexts: list[Any], batch_rest: tuple[Any, ...] = (),
             single_rest: tuple[Any, ...] = ()) -> None:
        """An observer hook over a batch: twins once with the lists (and ``batch_rest``),
        the other plugins per message (with ``single_rest``). What an implementation
        raises is logged and the next one is called (a twin that raises has then not
        seen the messages after the one it failed on)."""
        steps = self._current()
        if self._per_message:
            for message, ctx in zip(messages, contexts, strict=True):
                self._single.each(message, ctx, *single_rest)
            return
        for function, is_batch, positions in steps:
            if is_batch:
                args: tuple[Any, ...] = (messages, contexts, *batch_rest)
                try:
                    if positions is None:
                        function(*args)
                    else:
                        function(*[args[index] for index in positions])
                except Exception:
                    _log_failure(self._batch.name, function, self._impls[1])
                continue
            for message, ctx in zip(messages, contexts, strict=True):
                args = (message, ctx, *single_rest)
                try:
                    if positions is None:
                        function(*args)
                    else:
                        function(*[args[index] for index in positions])
                except Exception:
                    _log_failure(self._single._caller.name, function, self._impls[0])


def _positions(argnames: Sequence[str], names: tuple[str, ...]) -> tuple[int, ...] | None:
    if tuple(argnames) == names:
        return None
    return tuple(names.index(name) for name in argnames)


def orphan_twins(single: pluggy.HookCaller, batch: pluggy.HookCaller) -> list[str]:
    """Names of the plugins implementing ``batch`` but not ``single`` (an error: a twin
    is used only in addition to its plugin's per-message hook)."""
    plugins = {id(impl.plugin) for impl in single.get_hookimpls()}
    return [impl.plugin_name for impl in batch.get_hookimpls() if id(impl.plugin) not in plugins]
