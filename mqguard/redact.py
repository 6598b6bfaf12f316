"""Masking credentials in URLs before they are printed, logged or raised.

Every URL mqguard shows (CLI errors, logs, ``/health``, events, exception
messages) goes through :func:`redact_url` first. The masking does not trust a
URL parser: a password written without percent-encoding may hold ``/``, ``?``,
``#``, ``@``, ``[``, ``]`` or a space, and then :func:`urllib.parse.urlsplit`
ends the host part early (``stomp://u:123/x@h`` parses as host ``u``, port
``123``) and would leave the password in the "path". So the rule is textual:

* everything between ``://`` and the **last** ``@`` is user-info and is masked
  (the user name is kept when it is plainly one: the text before the first
  ``:`` holding no delimiter);
* without an ``@``, a URL that does not parse (a bad port, an unbalanced
  ``[``) is not echoed beyond its scheme, since what failed may be a secret;
* query parameters named like a secret (``password``, ``token``, ...) are masked.

Over-masking (a ``@`` in a query string hides the host too) is accepted: a URL
shown incompletely is a smaller harm than a password shown at all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import SplitResult, parse_qsl, quote, unquote, urlsplit

__all__ = ["AMBIGUOUS_USERINFO", "MASK", "redact_text", "redact_url", "redact_urls_in",
           "split_server_url", "url_secrets", "userinfo_is_ambiguous"]

#: What replaces a secret.
MASK = "***"
#: Why a URL whose user-info a parser would cut short is refused (see userinfo_is_ambiguous).
AMBIGUOUS_USERINFO = ("its user name or password holds an unencoded '/', '?', '#', '[' or ']', "
                      "which would be read as part of the host; percent-encode it "
                      "(%2F, %3F, %23, %5B, %5D; '@' as %40, ':' in a user name as %3A)")

# Characters that end a URL's authority (RFC 3986 gen-delims other than ':' and '@'),
# plus the ones that cannot appear in a user name unencoded at all.
_DELIMITERS = frozenset("/?#[]@ ")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


def _is_secret_param(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in ("pass", "token", "secret", "pwd"))


def _mask_query(after_host: str) -> str:
    """``after_host`` (``host:port/path?query#fragment``) with secret-like parameters masked."""
    head, sep, query = after_host.partition("?")
    if not sep:
        return after_host
    query, hash_sep, fragment = query.partition("#")
    try:
        pairs = parse_qsl(query, keep_blank_values=True)
    except ValueError:
        return f"{head}?{MASK}"
    if not any(_is_secret_param(name) for name, _ in pairs):
        return after_host
    masked = "&".join(
        f"{quote(name, safe='')}="
        f"{MASK if _is_secret_param(name) else quote(value, safe='/:,')}"
        for name, value in pairs)
    return f"{head}?{masked}{hash_sep}{fragment}"


def redact_url(url: str) -> str:
    """``url`` with its user-info (and secret-like query parameters) replaced by ``***``.

    Safe for any text, URL or not, parseable or not: see the module docstring.
    ``stomp://alice:s3cret@h:61613`` gives ``stomp://alice:***@h:61613``;
    ``stomp://alice:12/3@h`` gives ``stomp://alice:***@h``; ``stomp://h:6x13``
    (unparsable, no ``@``) gives ``stomp://<unparsable URL>``.
    """
    match = _SCHEME.match(url)
    if match is None:
        # Not a URL with an authority; "user:pass@host" written without a scheme is
        # still masked up to its last "@".
        if "@" in url:
            return f"{MASK}@{url.rpartition('@')[2]}"
        return url
    scheme, rest = match.group(1), url[match.end():]
    if "@" in rest:
        userinfo, _, after = rest.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        keep = colon and user and not (set(user) & _DELIMITERS)
        return f"{scheme}://{user if keep else ''}:{MASK}@{_mask_query(after)}"
    if not _authority_parses(rest):
        return f"{scheme}://<unparsable URL>"
    return f"{scheme}://{_mask_query(rest)}"


# One host of an authority: a name, an IPv4 address or a bracketed IPv6 one, and a port.
_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~%!$&'()*+;=\-]*)(:[0-9]*)?")


def _authority_parses(rest: str) -> bool:
    """True when the authority of ``rest`` (the URL after ``://``, without user-info) is
    hosts and ports only; comma-separated seeds (``redis+cluster://a:1,b:2``) count."""
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    return all(_HOST.fullmatch(host) for host in authority.split(","))


def userinfo_is_ambiguous(url: str) -> bool:
    """True when ``url`` holds an ``@`` that a URL parser does not read as the end of
    the user-info: a password with an unencoded ``/``, ``?`` or ``#`` (the parser then
    takes part of the password for the host and port). Such a URL must be refused,
    not connected to."""
    match = _SCHEME.match(url)
    if match is None or "@" not in url[match.end():]:
        return False
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        return True
    rest = url[match.end():]
    # The parser's user-info is the netloc's up to its last "@"; the textual one runs to
    # the last "@" of the whole rest. They differ exactly when a delimiter cut it short.
    return netloc.rpartition("@")[0] != rest.rpartition("@")[0]


def url_secrets(url: str) -> list[str]:
    """The strings of ``url`` that may be secrets: the user-info (whole and its password,
    raw and percent-decoded) and secret-like query values; for scrubbing texts that
    third-party code built from the URL (an exception message quoting it)."""
    secrets: list[str] = []
    match = _SCHEME.match(url)
    rest = url[match.end():] if match else url
    if "@" in rest:
        userinfo = rest.rpartition("@")[0]
        password = userinfo.partition(":")[2]
        for candidate in (userinfo, password):
            if candidate:
                secrets += [candidate, unquote(candidate)]
    elif match is not None and not _authority_parses(rest):
        # Not shown by redact_url either: whatever failed to parse may be a secret.
        secrets.append(rest)
    query = rest.partition("?")[2].partition("#")[0]
    try:
        pairs = parse_qsl(query, keep_blank_values=True)
    except ValueError:
        pairs = []
    secrets += [value for name, value in pairs if value and _is_secret_param(name)]
    # Longest first, so that a password is not half-replaced inside its own user-info.
    return sorted({s for s in secrets if s}, key=len, reverse=True)


def redact_text(text: str, url: str) -> str:
    """``text`` (an error message, a log line) with ``url`` and its secrets masked."""
    if url:
        text = text.replace(url, redact_url(url))
    for secret in url_secrets(url):
        text = text.replace(secret, MASK)
    return text


# A URL in free text: a scheme, "://", then up to a quote, a newline or the end. A password
# may hold blanks, so the user-info runs to the last "@" before that end; without one, the
# URL ends at the first blank.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^'\"\n]*")


def redact_urls_in(text: str) -> str:
    """``text`` with the user-info of every URL in it masked (error messages, reprs)."""

    def mask(match: re.Match[str]) -> str:
        span = match.group(0)
        if "@" in span.partition("://")[2]:
            head, _, tail = span.rpartition("@")
            url, blank, rest = tail.partition(" ")
            return redact_url(f"{head}@{url}") + blank + rest
        url, blank, rest = span.partition(" ")
        return redact_url(url) + blank + rest

    return _URL_IN_TEXT.sub(mask, text)


def split_server_url(url: str, default_ports: Mapping[str, int], *, what: str
                     ) -> tuple[SplitResult, str, int]:
    """Split the URL of a server (a broker, the sidecar's upstream): its parts, host and
    port (the scheme's default from ``default_ports`` when none is given).

    Raises ValueError with a message that names ``what`` and shows the URL masked: a URL
    whose user-info a parser would cut short (:func:`userinfo_is_ambiguous`), one that does
    not parse, a scheme not in ``default_ports``, no host, or a bad port.
    """
    safe = redact_url(url)
    if userinfo_is_ambiguous(url):
        raise ValueError(f"{what} {safe!r}: {AMBIGUOUS_USERINFO}")
    try:
        parts = urlsplit(url)
    except ValueError:  # an unbalanced "[" or "]"
        raise ValueError(f"{what} {safe!r} is not a valid URL") from None
    if parts.scheme not in default_ports:
        schemes = " or ".join(f"{scheme}://" for scheme in default_ports)
        raise ValueError(f"{what} {safe!r}: scheme must be {schemes}")
    if not parts.hostname:
        raise ValueError(f"{what} {safe!r} has no host")
    try:
        port = parts.port or default_ports[parts.scheme]
    except ValueError:
        raise ValueError(f"{what} {safe!r} has an invalid port") from None
    return parts, parts.hostname, port
