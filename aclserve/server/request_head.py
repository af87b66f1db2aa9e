"""A complete request head as the connection guard reads it: framing.py parses it (once for a
head repeated byte for byte: its memo), plain.py, direct.py and shedding.py read it.

A head also says whether its request ends its connection after its answer (RFC 9112 9.3, 9.6),
read as aiohttp's parser (llhttp) reads it: llhttp refuses any byte after such a request but
line ends (400 `Data after Connection: close`, in place of every answer still due from that
read, the closing request's own included), so the framing hands aiohttp nothing after it, and
a direct answer to one says `Connection: close` and closes the connection once written. llhttp
reads `Proxy-Connection` as it reads `Connection`: an HTTP/1.1 request ends its connection with
a `close` token in either, an HTTP/1.0 one unless it has a `keep-alive` token there. aiohttp's
own Python parser (AIOHTTP_NO_EXTENSIONS=1, or no C extension for the platform) reads them
otherwise, and its rule is followed when it is the one in use: `Connection` alone, a `close`
token ends the connection, else a `keep-alive` token keeps it, else HTTP/1.0 ends it."""
from __future__ import annotations

from typing import Callable


class Head:
    """A complete request head, never changed once made. `header(name)` reads a header (name in
    lower case) from the lower-cased head: the value of its first occurrence, stripped, or None
    (`as_sent`: the value as the client wrote it); `header_all(name)` the values of all its
    occurrences, `tokens(name)` their tokens. `derived(key, derive)`: what a reader works out
    from the head alone, kept in `memo` under its own key (a repeated head is the same Head, so
    it is worked out once). `closes`: the request ends its connection (module docstring)."""

    __slots__ = ("method", "target", "version", "_lower", "_raw", "memo", "closes")

    def __init__(self, method: bytes, target: bytes, version: bytes, lower: bytes, raw: bytes = b"",
                 llhttp: bool = True):
        """`llhttp`: whether aiohttp's parser in use is llhttp, not its Python parser (framing.LLHTTP)."""
        self.method, self.target, self.version, self._lower, self._raw = method, target, version, lower, raw
        self.memo: dict = {}
        self.closes = ends_connection(self, llhttp)

    def derived(self, key: str, derive: Callable[["Head"], object]):
        """`derive(self)`, computed on the first call for `key` and kept."""
        try:
            return self.memo[key]
        except KeyError:
            value = self.memo[key] = derive(self)
            return value

    # header and header_all each read a value inline, not one through the other: the first value
    # taken from header_all, or both through one reader of the value at a position, made a header
    # found 20-45 % slower (timeit, a python-requests infer head: 1.09 us to 1.31-1.56 us), and
    # header runs per request (direct.py's X-Request-Id)
    def header(self, name: bytes, as_sent: bool = False) -> bytes | None:
        at = self._lower.find(b"\r\n" + name + b":")
        if at < 0:
            return None
        at += len(name) + 3
        end = self._lower.find(b"\r\n", at)
        return (self._raw if as_sent else self._lower)[at:end if end >= 0 else len(self._lower)].strip(b" \t")

    def header_all(self, name: bytes, as_sent: bool = False) -> list[bytes]:
        """The values of every occurrence of a header, stripped, as `header` reads the first."""
        key = b"\r\n" + name + b":"
        found, at = [], self._lower.find(key)
        while at >= 0:
            at += len(key)
            end = self._lower.find(b"\r\n", at)
            end = len(self._lower) if end < 0 else end
            found.append((self._raw if as_sent else self._lower)[at:end].strip(b" \t"))
            at = self._lower.find(key, end)
        return found

    def tokens(self, name: bytes) -> list[bytes]:
        """The comma-separated tokens of every occurrence of a list header (name in lower
        case), OWS (spaces, tabs) stripped: `Connection` is read as aiohttp reads it."""
        return [token.strip(b" \t") for value in self.header_all(name) for token in value.split(b",")]


def ends_connection(head: Head, llhttp: bool) -> bool:
    """Whether `head`'s request ends its connection as aiohttp's parser in use reads it (module
    docstring); the Python parser's rule was not followed: a request it kept the connection open
    for was answered and what came after it dropped, the client left waiting (a reviewer)."""
    if not llhttp:
        tokens = head.tokens(b"connection")
        return b"close" in tokens or (b"keep-alive" not in tokens and head.version != b"HTTP/1.1")
    tokens = head.tokens(b"connection") + head.tokens(b"proxy-connection")
    if head.version == b"HTTP/1.1":
        return b"close" in tokens
    return b"keep-alive" not in tokens
