"""A small evaluator of JMS (SQL-92) message selectors, for consumer filters.

Load balancing (ON_DEMAND) and redistribution send a message only to a node whose
consumers would accept it (Artemis ``RemoteQueueBinding.isHighAcceptPriority``,
``BindingsImpl.redistribute``). The consumers' selectors run on the brokers; this
module decides the same question on the sending side, over the message's headers.

Supported: identifiers (headers), string literals (``'it''s'``), integers and
decimals, ``TRUE``/``FALSE``, ``= <> < > <= >=``, ``AND OR NOT``, parentheses,
``IS [NOT] NULL``, ``[NOT] IN (...)``, ``[NOT] LIKE 'pat' [ESCAPE 'c']`` and
``[NOT] BETWEEN a AND b``, with SQL's three-valued logic (an absent header is
NULL, and a comparison with NULL is unknown, which does not match). A header
compared with a number is read as a number (headers are strings on STOMP).
Arithmetic is not supported: :class:`SelectorError` is raised when parsing, and
callers treat such a consumer as accepting everything (documented in
docs/load-balancing.md) rather than starving it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import lru_cache

__all__ = ["Selector", "SelectorError", "compile_selector"]

#: Longest selector accepted (selectors come from other processes through the store).
MAX_SELECTOR_LENGTH = 4096

_TOKEN = re.compile(r"""
    \s*(?:
      (?P<str>'(?:[^']|'')*')
    | (?P<num>\d+\.\d*|\.\d+|\d+)
    | (?P<op><>|<=|>=|=|<|>|\(|\)|,)
    | (?P<id>[A-Za-z_$][A-Za-z0-9_$.\-]*)
    )""", re.VERBOSE)

_KEYWORDS = {"AND", "OR", "NOT", "IS", "NULL", "IN", "LIKE", "ESCAPE", "BETWEEN", "TRUE",
             "FALSE"}

Value = str | float | bool | None
Node = Callable[[Mapping[str, str]], Value]


class SelectorError(ValueError):
    """The selector is not valid or uses something this evaluator does not support."""


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise SelectorError(f"unexpected character {text[pos:pos + 10]!r} at {pos}")
        kind = match.lastgroup or ""
        value = match.group(kind)
        if kind == "id" and value.upper() in _KEYWORDS:
            kind, value = "kw", value.upper()
        out.append((kind, value))
        pos = match.end()
    return out


def _number(value: Value) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float):
        return value
    try:
        return float(value)
    except ValueError:
        return None


def _compare(op: str, left: Value, right: Value) -> bool | None:
    if left is None or right is None:
        return None
    if isinstance(left, float) or isinstance(right, float):
        a, b = _number(left), _number(right)
        if a is None or b is None:
            return None
        pair: tuple[object, object] = (a, b)
    elif isinstance(left, bool) or isinstance(right, bool):
        if op not in ("=", "<>"):
            return None
        pair = (str(left).lower(), str(right).lower())
    else:
        pair = (left, right)
    a2, b2 = pair
    if op == "=":
        return a2 == b2
    if op == "<>":
        return a2 != b2
    try:
        return {"<": a2 < b2, ">": a2 > b2, "<=": a2 <= b2,  # type: ignore[operator]
                ">=": a2 >= b2}[op]  # type: ignore[operator]
    except TypeError:
        return None


def _not(value: Value) -> bool | None:
    return None if value is None else not value


def _like(pattern: str, escape: str | None) -> re.Pattern[str]:
    out, i = [], 0
    while i < len(pattern):
        char = pattern[i]
        if escape and char == escape and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if char == "%" else "." if char == "_" else re.escape(char))
        i += 1
    return re.compile("".join(out), re.DOTALL)


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.pos = 0

    def peek(self, *values: str) -> bool:
        if self.pos < len(self.tokens):
            kind, value = self.tokens[self.pos]
            return value in values and kind in ("kw", "op")
        return False

    def take(self, *values: str) -> str:
        if not self.peek(*values):
            found = self.tokens[self.pos][1] if self.pos < len(self.tokens) else "the end"
            raise SelectorError(f"expected {' or '.join(values)}, found {found!r}")
        self.pos += 1
        return self.tokens[self.pos - 1][1]

    def parse(self) -> Node:
        node = self.or_()
        if self.pos != len(self.tokens):
            raise SelectorError(f"unexpected {self.tokens[self.pos][1]!r}")
        return node

    def or_(self) -> Node:
        node = self.and_()
        while self.peek("OR"):
            self.take("OR")
            left, right = node, self.and_()

            def either(h: Mapping[str, str], a: Node = left, b: Node = right) -> Value:
                x, y = a(h), b(h)
                if x is True or y is True:
                    return True
                return None if x is None or y is None else False
            node = either
        return node

    def and_(self) -> Node:
        node = self.not_()
        while self.peek("AND"):
            self.take("AND")
            left, right = node, self.not_()

            def both(h: Mapping[str, str], a: Node = left, b: Node = right) -> Value:
                x, y = a(h), b(h)
                if x is False or y is False:
                    return False
                return None if x is None or y is None else True
            node = both
        return node

    def not_(self) -> Node:
        if self.peek("NOT"):
            self.take("NOT")
            inner = self.not_()
            return lambda h: _not(inner(h))
        return self.predicate()

    def predicate(self) -> Node:
        left = self.primary()
        negate = False
        if self.peek("IS"):
            self.take("IS")
            negate = bool(self.peek("NOT") and self.take("NOT"))
            self.take("NULL")
            return lambda h: (left(h) is None) != negate
        if self.peek("NOT"):
            self.take("NOT")
            negate = True
            if not self.peek("IN", "LIKE", "BETWEEN"):
                raise SelectorError("NOT here must be followed by IN, LIKE or BETWEEN")
        if self.peek("IN"):
            self.take("IN")
            self.take("(")
            items = [self.literal()]
            while self.peek(","):
                self.take(",")
                items.append(self.literal())
            self.take(")")

            def member(h: Mapping[str, str]) -> Value:
                value = left(h)
                if value is None:
                    return None
                return any(_compare("=", value, item) for item in items) != negate
            return member
        if self.peek("LIKE"):
            self.take("LIKE")
            pattern = self.literal()
            escape = None
            if self.peek("ESCAPE"):
                self.take("ESCAPE")
                escape = self.literal()
            if not isinstance(pattern, str) or (escape is not None and not (
                    isinstance(escape, str) and len(escape) == 1)):
                raise SelectorError("LIKE needs a string pattern and a one-character ESCAPE")
            regex = _like(pattern, escape)

            def like(h: Mapping[str, str]) -> Value:
                value = left(h)
                if not isinstance(value, str):
                    return None
                return (regex.fullmatch(value) is not None) != negate
            return like
        if self.peek("BETWEEN"):
            self.take("BETWEEN")
            low = self.primary()
            self.take("AND")
            high = self.primary()

            def between(h: Mapping[str, str]) -> Value:
                value = left(h)
                a, b = _compare(">=", value, low(h)), _compare("<=", value, high(h))
                if a is None or b is None:
                    return None
                return (a and b) != negate
            return between
        if self.peek("=", "<>", "<", ">", "<=", ">="):
            op = self.take("=", "<>", "<", ">", "<=", ">=")
            right = self.primary()
            return lambda h: _compare(op, left(h), right(h))
        return left

    def literal(self) -> Value:
        kind, value = self.tokens[self.pos] if self.pos < len(self.tokens) else ("", "")
        if kind == "str":
            self.pos += 1
            return value[1:-1].replace("''", "'")
        if kind == "num":
            self.pos += 1
            return float(value)
        if kind == "kw" and value in ("TRUE", "FALSE"):
            self.pos += 1
            return value == "TRUE"
        raise SelectorError(f"expected a literal, found {value or 'the end'!r}")

    def primary(self) -> Node:
        if self.peek("("):
            self.take("(")
            node = self.or_()
            self.take(")")
            return node
        if self.pos < len(self.tokens) and self.tokens[self.pos][0] == "id":
            name = self.tokens[self.pos][1]
            self.pos += 1
            return lambda h: h.get(name)
        constant = self.literal()
        return lambda h: constant


class Selector:
    """A compiled selector: ``matches(headers)``."""

    __slots__ = ("_node", "text")

    def __init__(self, text: str) -> None:
        if len(text) > MAX_SELECTOR_LENGTH:
            raise SelectorError(f"selector longer than {MAX_SELECTOR_LENGTH} characters")
        self.text = text
        self._node = _Parser(text).parse()

    def matches(self, headers: Mapping[str, str]) -> bool:
        """True only when the selector is TRUE for these headers (unknown does not match)."""
        return self._node(headers) is True


@lru_cache(maxsize=1024)
def compile_selector(text: str) -> Selector:
    """Compile (and cache) ``text``; :class:`SelectorError` when it is not supported."""
    return Selector(text)
