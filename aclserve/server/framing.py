"""Where each request of an HTTP/1.1 connection begins and ends, read from its bytes before
aiohttp's parser sees them, so the connection guard can answer a request itself (shedding.py)
and aiohttp never sees it.

Only what framing needs is read: the request line, Content-Length, and the headers that make
the framing unknowable here (Transfer-Encoding; Upgrade with an `upgrade` token in Connection,
which llhttp takes as a switch of protocol; CONNECT too). A connection that uses them, or whose
head is malformed, of a method aiohttp's parser does not know or longer than MAX_HEAD_BYTES, is
given up: everything from there on goes to aiohttp untouched, which answers (or refuses) it as
before. Empty lines before a request line are passed on and skipped, as both of aiohttp's
parsers skip them (RFC 9112 2.2). Bytes are forwarded in as few pieces as possible (a chunk
holding whole requests is passed on as it is). Nothing after a request that ends its
connection (`Connection: close`: request_head.py) is passed on: the server answers it,
closes, and ignores what follows (RFC 9112 9.6).

A head is parsed once: clients repeat their heads byte for byte (the same path, host, type
and, for tensors of a fixed shape, length), so parse_head keeps its last MEMO_HEADS results,
and a repeated head is the same Head, whose `memo` keeps what its readers worked out from it
(plain.py, direct.py, shedding.py). Parsing a head and reading its headers took about 5 us of a light
request's 54 us of server CPU; measured side by side on one core (light MLP JSON, 64 clients),
the memo took a request from 54 to 47-48 us (18,200-18,400 to 21,000-21,300 req/s).
"""
from __future__ import annotations

import re
from typing import Callable

from aiohttp import http_parser
from aiohttp.http_parser import SINGLETON_HEADERS

from .request_head import Head

# whether aiohttp parses requests with llhttp (its C extension), not its Python parser
# (AIOHTTP_NO_EXTENSIONS=1, or no C extension for the platform): they read Connection apart (request_head.py)
LLHTTP = http_parser.HttpRequestParser is not http_parser.HttpRequestParserPy
MAX_HEAD_BYTES = 16384  # aiohttp's own limits (8190 per line) refuse longer heads anyway
MAX_LINE_BYTES = 8190  # aiohttp's limits on a head's lines and on its number of headers
MAX_HEADERS = 128
MEMO_HEADS = 256  # parse_head results kept (a full memo is emptied: a flood of new heads only misses)
MEMO_HEAD_BYTES = 2048  # longer heads are parsed each time (the memo holds about 1.5 MB at most:
#                        each entry's key, and its Head's lower-cased and as-sent copies)
# What aiohttp's parser (llhttp) accepts, and no more: a request line of a token method, a
# target in origin form (`/` then visible ASCII; `*` for OPTIONS) and HTTP/1.0 or 1.1; header
# lines `token:value` (no space before the colon, no line folding) whose values hold no control
# bytes but tabs. A head it would refuse (400) is given up here, so that the guard never answers
# (nor frames by its own reading) a request aiohttp would not have run. Other targets are given
# up: llhttp and yarl refuse most (`x`, `?x`, `:x`, `*` but for OPTIONS), and which absolute ones
# they take (the host's characters, its port's range) is theirs to say.
_TOKEN_BYTE = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]"
_VALUE_BYTE = rb"[ \t\x21-\x7e\x80-\xff]"
_TOKEN = _TOKEN_BYTE + b"+"
_STRICT_HEAD = re.compile(_TOKEN + rb" (?:/[\x21-\x7e]*|(?<=OPTIONS )\*) HTTP/1\.[01]"
                          rb"(?:\r\n" + _TOKEN + b":" + _VALUE_BYTE + b"*)*")
# an Upgrade header with an `upgrade` token in Connection (llhttp: in Proxy-Connection too) is a
# switch of protocol to llhttp, which reads nothing more of that read as requests: framing gives
# up on any `upgrade` in those headers' values, a token or not (without it, llhttp and aiohttp's
# Python parser read Upgrade as any header)
_UPGRADING = re.compile(rb"\r\n(?:proxy-)?connection:[^\r]*upgrade")
_NAME_BYTES, _VALUE_BYTES = re.compile(_TOKEN_BYTE + b"*"), re.compile(_VALUE_BYTE + b"*")
# aiohttp's own checks on top of llhttp's: these headers at most once (Host too, below: once on HTTP/1.1;
# Content-Length and Transfer-Encoding make _body_length give up), and no Sec-WebSocket-Key1
_CHECKED_NAMES = re.compile(rb"\r\n(" + b"|".join(
    re.escape(name.encode()) for name in sorted(SINGLETON_HEADERS - {"host", "content-length", "transfer-encoding"})
) + rb"|sec-websocket-key1):")


def _request_line(raw: bytes) -> list[bytes] | None:
    """(method, target, version), or None for a line framed otherwise by aiohttp: a method its parser
    does not know (llhttp refuses it, 400; framed here, the requests before it came to aiohttp with it
    in one call and their answers were lost), or CONNECT, whose Content-Length llhttp ignores (an
    upgrade: what follows its head is read as new requests, which here were its body: the two
    framings fell out of step, a reviewer's smuggled request answered in another's place), or PRI,
    which llhttp takes only as HTTP/2's connection preface (400 for `PRI / HTTP/1.1`)."""
    line_end = raw.find(b"\r\n")
    parts = (raw if line_end < 0 else raw[:line_end]).split(b" ")
    return parts if len(parts) == 3 and parts[0] in _FRAMED_METHODS else None


def _body_length(lower: bytes) -> int | None:
    """The body length a lower-cased head declares, or None when it cannot be known here
    (chunked, an upgrade, a bare LF, repeated Content-Length, a length not all digits or of more
    than 18 digits but its leading zeros: `00000000000000000406` is 406 to aiohttp's parsers)."""
    if (b"\r\ntransfer-encoding:" in lower or (b"\r\nupgrade:" in lower and _UPGRADING.search(lower))
            or lower.count(b"\n") != lower.count(b"\r\n")):  # a bare LF: aiohttp refuses the head
        return None
    at = lower.find(b"\r\ncontent-length:")
    if at < 0:
        return 0
    at += 17
    if lower.find(b"\r\ncontent-length:", at) >= 0:
        return None  # a repeated Content-Length is refused by aiohttp: let it say so
    end = lower.find(b"\r\n", at)
    value = lower[at:end if end >= 0 else len(lower)].strip()
    digits = value.lstrip(b"0")  # (int() refuses a string of more than 4,300 digits, zeros included)
    if not value.isdigit() or len(digits) > 18:
        return None
    return int(digits or b"0")


# The methods aiohttp's parser (llhttp) knows, and every start of one: bytes that begin no
# request it takes are handed to it at once (_request_start)
_METHODS = frozenset(b"GET HEAD POST PUT DELETE CONNECT OPTIONS TRACE PATCH COPY LOCK MKCOL MOVE PROPFIND "
                     b"PROPPATCH SEARCH UNLOCK BIND REBIND UNBIND ACL REPORT MKACTIVITY CHECKOUT MERGE M-SEARCH "
                     b"NOTIFY SUBSCRIBE UNSUBSCRIBE PURGE MKCALENDAR LINK UNLINK SOURCE QUERY PRI".split())
_METHOD_STARTS = frozenset(m[:i] for m in _METHODS for i in range(1, len(m) + 1))
_LONGEST_METHOD = max(map(len, _METHODS))
_FRAMED_METHODS = _METHODS - {b"CONNECT", b"PRI"}  # (_request_line; llhttp takes PRI as HTTP/2's preface alone)


def _request_start(data: bytes | bytearray, pos: int, seen: int = 0) -> bool | None:
    """Whether the bytes at `pos`, short of a whole head, begin a request aiohttp takes: False
    when they cannot (its parser refuses at once, so garbage, or a body sent past its
    Content-Length, is answered 400 there rather than held here until the header timeout;
    also a request line over MAX_LINE_BYTES), True when its request line is whole and sound
    (_HeadLines reads the lines after it), None while that line is still coming, or for a last
    CR whose LF may make it an empty line (held: the feed skips it once whole). `seen`: bytes
    at `pos` already looked at (they hold no line end), so a head sent in pieces is read once."""
    if pos == len(data) - 1 and data[pos] == 13:
        return None
    space = data.find(b" ", pos, pos + _LONGEST_METHOD + 1)
    if space >= 0:
        if bytes(data[pos:space]) not in _METHODS:
            return False
    elif bytes(data[pos:pos + _LONGEST_METHOD + 1]) not in _METHOD_STARTS:
        return False
    line_end = data.find(b"\r\n", pos + max(0, seen - 1))
    if line_end < 0:
        return None if len(data) - pos <= MAX_LINE_BYTES + 1 else False  # (+1: a CR, its LF to come)
    return line_end - pos <= MAX_LINE_BYTES and _STRICT_HEAD.fullmatch(data, pos, line_end) is not None


class _HeadLines:
    """The header lines of a head still coming (its request line whole and sound), read as they
    come against what parse_head takes: token names, a colon right after them, values of
    _VALUE_BYTE, lines of at most MAX_LINE_BYTES, two names in a row within it too, at most
    MAX_HEADERS header lines. `hopeless(held)` is True once no ending can make the head one it takes
    (llhttp would refuse it: aiohttp answers 400 at once, where holding it waits for the header
    timeout). Each byte is looked at once: a head sent in small pieces stays linear."""

    __slots__ = ("line_at", "checked", "in_value", "headers", "last_name")

    def __init__(self, held: bytes | bytearray):
        self.line_at = self.checked = held.find(b"\r\n") + 2  # the current line; what of it was read
        self.in_value = False  # its name and colon read
        self.headers = self.last_name = 0  # complete header lines; the length of the last one's name

    def hopeless(self, held: bytes | bytearray) -> bool:
        at, size = self.checked, len(held)
        while at < size:
            if not self.in_value:
                at = _NAME_BYTES.match(held, at).end()
                if at == size:
                    break
                if at == self.line_at and held[at] == 13:  # the blank line that ends the head, or a bare CR
                    if at + 1 < size and held[at + 1] != 10:
                        return True
                    break
                name = at - self.line_at
                if held[at] != 58 or not name or name + self.last_name > MAX_LINE_BYTES:  # 58: a colon
                    return True
                self.in_value, self.last_name, at = True, name, at + 1
                continue
            at = _VALUE_BYTES.match(held, at).end()
            if at == size or (at + 1 == size and held[at] == 13):  # a CR, its LF yet to come
                break
            if held[at:at + 2] != b"\r\n" or at - self.line_at > MAX_LINE_BYTES:
                return True
            self.headers += 1
            if self.headers > MAX_HEADERS:
                return True
            self.line_at = at = at + 2
            self.in_value = False
        self.checked = at
        partial = (self.last_name if not self.in_value else 0) + at - self.line_at
        return partial > MAX_LINE_BYTES


_parsed: dict[bytes, tuple[Head, int] | None] = {}  # the memo; the event loop's thread only


def parse_head(raw: bytes) -> tuple[Head, int] | None:
    """(head, body length) of a head without its final blank line, or None when this module
    cannot know where the request ends (chunked, upgrade, conflicting lengths) or aiohttp would
    refuse the head (_STRICT_HEAD, the line and header limits, two Hosts, none on HTTP/1.1, a header of
    aiohttp's SINGLETON_HEADERS twice, Sec-WebSocket-Key1). A head seen lately: the same answer
    (the same Head), from the memo."""
    if len(raw) > MEMO_HEAD_BYTES:
        return _parse_head(raw)
    try:
        return _parsed[raw]
    except KeyError:
        pass
    if len(_parsed) >= MEMO_HEADS:
        _parsed.clear()
    parsed = _parsed[raw] = _parse_head(raw)
    return parsed


def _over_limits(raw: bytes) -> bool:
    """A line over MAX_LINE_BYTES, or two header names in a row longer than that together:
    aiohttp's C parser measures a header's name before it has let go of the previous one
    (`Got more than 8190 bytes when reading`, 400), so 8,177 bytes of name followed by
    `Content-Length` is refused there although each line fits."""
    lines = raw.split(b"\r\n")
    if any(len(line) > MAX_LINE_BYTES for line in lines):
        return True
    names = [len(line.partition(b":")[0]) for line in lines[1:]]
    return any(a + b > MAX_LINE_BYTES for a, b in zip(names, names[1:]))


def _parse_head(raw: bytes) -> tuple[Head, int] | None:
    if (_STRICT_HEAD.fullmatch(raw) is None or raw.count(b"\r\n") > MAX_HEADERS
            or (len(raw) > MAX_LINE_BYTES and _over_limits(raw))):
        return None
    parts = _request_line(raw)
    if parts is None:
        return None
    lower = raw.lower()
    hosts = lower.count(b"\r\nhost:")  # aiohttp asks HTTP/1.1 for one, HTTP/1.0 for none (RFC 9112 3.2)
    if hosts > 1 or (hosts == 0 and parts[2] == b"HTTP/1.1"):
        return None
    names = _CHECKED_NAMES.findall(lower)
    if names and (b"sec-websocket-key1" in names or len(set(names)) != len(names)):
        return None
    length = _body_length(lower)
    if length is None:
        return None
    return Head(parts[0], parts[1], parts[2], lower + b"\r\n", raw + b"\r\n", LLHTTP), length


FORWARD, ANSWERED, NEED_BODY = "forward", "answered", "need body"


class RequestFraming:
    """The framing of one connection. `feed(data)` passes the bytes on to `forward`, except
    that, while `wanted()`, each complete head is first offered to `answer(head, body_length,
    body)` (body: a memoryview of the whole body when it came in the same chunk as the head,
    else None), which says FORWARD, ANSWERED (the request was answered: its head and body are
    dropped here) or NEED_BODY (ask again with the whole body: the request is held back until
    it has come).
    Otherwise heads are only framed (parse_head: its memo makes a repeated head cost a lookup,
    where measuring its length cost ten times as much) and `passed()` is called for each
    request forwarded so (the caller counts every request aiohttp has to answer). After an
    answer, `paused()` True stops the feed; what is left of the chunk is returned (the caller
    keeps it and feeds it again later). Once a request that ends the connection (`closed`)
    has been passed on or answered, every byte after it is dropped."""

    __slots__ = ("_forward", "_answer", "_paused", "_wanted", "_passed", "_held", "_held_need", "_lines",
                 "_remaining", "_dropping", "lost", "closed")

    def __init__(self, forward: Callable[[bytes], None], answer: Callable[[Head, int, memoryview | None], str],
                 paused: Callable[[], bool], wanted: Callable[[], bool] = lambda: True,
                 passed: Callable[[], None] = lambda: None):
        self._forward, self._answer, self._paused, self._wanted = forward, answer, paused, wanted
        self._passed = passed
        self._held = bytearray()  # the start of a request held back: its head is incomplete, or its body wanted
        self._held_need = 0  # bytes that request needs in all before it is looked at again (0: head incomplete)
        self._lines: _HeadLines | None = None  # the held head's header lines, once its request line is sound
        self._remaining = 0  # body bytes of the current request still to come
        self._dropping = False  # the current request was answered here: drop its body
        self.lost = False  # framing given up: everything goes to aiohttp
        self.closed = False  # a request that ends the connection came: what follows it is dropped

    @property
    def idle(self) -> bool:
        """Between requests: nothing held back, no body pending."""
        return not self._held and not self._remaining

    @property
    def body_pending(self) -> bool:
        """A body framed here has not all come: its bytes still go on (or are dropped) as they come."""
        return self._remaining > 0

    def feed(self, data: bytes) -> bytes:
        if self.lost:
            self._forward(data)
            return b""
        body_came = False  # the held request was waiting for its body (NEED_BODY), now here
        if self._held:
            if self._still_short(data):  # appends data to what is held
                return b""
            data, body_came = bytes(self._held), self._held_need > 0
            self._held, self._held_need = bytearray(), 0
        pos, start, size = 0, 0, len(data)  # data[start:pos] is forwarded, not yet passed on
        while pos < size:
            if self._remaining:
                n = min(self._remaining, size - pos)
                self._remaining -= n
                if self._dropping:
                    self._flush(data, start, pos)
                    start = pos + n
                pos += n
                continue
            if self.closed:  # llhttp would refuse what follows, the closing request's answer lost with it
                break
            if data.startswith(b"\r\n", pos):  # an empty line before a request: passed on, both parsers skip it
                pos += 2
                continue
            end = data.find(b"\r\n\r\n", pos, pos + MAX_HEAD_BYTES + 4)
            if end < 0:
                line = _request_start(data, pos)
                held = bytearray(data[pos:])
                lines = _HeadLines(held) if line else None
                if (size - pos > MAX_HEAD_BYTES or data.count(b"\n", pos) != data.count(b"\r\n", pos) or line is False
                        or (lines is not None and lines.hopeless(held))):
                    return self._give_up(data, start, pos)  # too long, a bare LF, not a request, or never a head
                self._flush(data, start, pos)
                self._held, self._lines = held, lines
                return b""
            body_at = end + 4
            asked, body_came = body_came, False
            parsed = parse_head(data[pos:end])
            if parsed is None:
                return self._give_up(data, start, pos)
            head, length = parsed
            if not self._wanted():
                self._remaining, self._dropping, self.closed = length, False, head.closes
                self._passed()
                pos = body_at
                continue
            whole = body_at + length <= size  # the body came with its head: offered at once
            decision = NEED_BODY if asked else self._answer(
                head, length, memoryview(data)[body_at:body_at + length] if whole else None)
            if decision == NEED_BODY:
                if not whole:  # hold the request back until its body is here
                    self._flush(data, start, pos)
                    self._held, self._held_need = bytearray(data[pos:]), body_at + length - pos
                    return b""
                decision = self._answer(head, length, memoryview(data)[body_at:body_at + length])
            self._remaining, self._dropping, self.closed = length, decision == ANSWERED, head.closes
            if not self._dropping:
                pos = body_at  # forwarded: part of the run from `start`
                continue
            self._flush(data, start, pos)
            pos = start = body_at
            if self._paused():
                n = min(length, size - pos)  # the answered body is dropped even now
                self._remaining -= n
                return data[pos + n:]
        self._flush(data, start, pos)
        return b""

    def _still_short(self, data: bytes) -> bool:
        """Add `data` to the request held back, True while it still cannot be looked at: its
        body has not all come, or no new byte completes its head (nor makes it one to give up
        on). Appending, not joining, keeps a request sent in small pieces linear to hold."""
        held = self._held
        tail = len(held)
        held += data
        if self._held_need:
            return len(held) < self._held_need
        new = held[max(0, tail - 3):]
        if b"\r\n\r\n" in new or len(held) > MAX_HEAD_BYTES or new.count(b"\n") != new.count(b"\r\n"):
            return False
        if self._lines is None:  # its request line still coming: read the new bytes only
            line = _request_start(held, 0, tail)
            if line is not True:
                return line is None
            self._lines = _HeadLines(held)
        return not self._lines.hopeless(held)

    def _flush(self, data: bytes, start: int, end: int) -> None:
        if end > start:
            self._forward(data if start == 0 and end == len(data) else data[start:end])

    def _give_up(self, data: bytes, start: int, pos: int) -> bytes:
        """Everything from here on goes to aiohttp: the requests before `pos` in a call of their
        own (its parser drops every request it read in a call that then fails: those before a
        bad one must still be answered)."""
        self.lost = True
        self._flush(data, start, pos)
        self._flush(data, pos, len(data))
        return b""
