"""Valid heads are framed as both of aiohttp's parsers frame them, whatever the chunks; a head
they frame otherwise, or refuse, leaves the connection given up to aiohttp."""
import asyncio
import random

import pytest
from aiohttp import http_parser
from aiohttp.base_protocol import BaseProtocol

from .framing_recorder import GET, KEEP, Recorder, post


FRAMED_AS_AIOHTTP_FRAMES = {  # valid heads the framing gave up on (a tester, t90)
    "' :' in values": post(b"/note", b"n" * 40, b"X-Note: a : b\r\nUser-Agent: curl :8\r\n"),
    "HTTP/1.0 without Host": b"GET /old HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    "an empty line before a request": b"\r\n" + GET,
    "two empty lines before a request": b"\r\n\r\n" + GET,
    "an empty line after a body": KEEP + b"\r\n",
    "a Content-Length of 40 digits, zeros first": post(b"/zeros", b"z" * 406).replace(b": 406", b": %040d" % 406),
    "Upgrade without an upgrade token in Connection": post(b"/up", b"u",
                                                           b"Upgrade: websocket\r\nConnection: keep-alive\r\n"),
    "Connection: upgrade without Upgrade": post(b"/up", b"u", b"Connection: upgrade\r\n"),
    "OPTIONS *": b"OPTIONS * HTTP/1.1\r\nHost: t\r\n\r\n",
}
GIVEN_UP_AS_AIOHTTP_FRAMES_THEM_OTHERWISE = {  # or refuses them, or one of its parsers does
    "an upgrade to h2c (llhttp reads no more of that read)": post(b"/up", b"u",
                                                                  b"Connection: Upgrade\r\nUpgrade: h2c\r\n"),
    "an upgrade by Proxy-Connection (llhttp alone)": post(b"/up", b"u",
                                                          b"Proxy-Connection: upgrade\r\nUpgrade: h2c\r\n"),
    "a bare LF before a request (the Python parser refuses it)": b"\n" + GET,
    "a CR, then an empty line (the Python parser refuses it)": b"\r\r\n" + GET,
    "a target beginning with a colon": b"GET :x HTTP/1.1\r\nHost: t\r\n\r\n",
    "* but for OPTIONS": b"GET * HTTP/1.1\r\nHost: t\r\n\r\n",
    "a target of no form": b"GET x HTTP/1.1\r\nHost: t\r\n\r\n",
    "two Hosts on HTTP/1.0": b"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\nConnection: keep-alive\r\n\r\n",
    "a Content-Length of 19 digits": post(b"/big", b"b").replace(b": 1", b": 1" + b"0" * 18),
}
# aiohttp reads some absolute targets, as this would, and refuses others by yarl's rules (a
# port over 65535, a host's characters): given up all the same
ABSOLUTE_TARGET = b"GET http://t/v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n"


LLHTTP_PARSER = getattr(http_parser, "HttpRequestParserC", None)  # None: aiohttp's C parser is not built here


def aiohttp_parsers() -> list:
    """aiohttp's parsers of requests built here."""
    return [cls for cls in (LLHTTP_PARSER, http_parser.HttpRequestParserPy) if cls is not None]


def targets_read(cls, stream: bytes) -> list[bytes] | None:
    """The targets of the requests one of aiohttp's parsers reads from `stream`, None when it
    refuses it or takes a request as a switch of protocol."""
    loop = asyncio.new_event_loop()
    try:
        messages, upgraded, _ = cls(BaseProtocol(loop), loop, 2**16).feed_data(stream)
    except Exception:  # noqa: BLE001 - any refusal
        return None
    finally:
        loop.close()
    return None if upgraded or any(m.upgrade for m, _ in messages) else [m.path.encode() for m, _ in messages]


@pytest.mark.parametrize("name", list(FRAMED_AS_AIOHTTP_FRAMES))
def test_a_valid_head_is_framed_as_aiohttp_s_parsers_frame_it_whatever_the_chunks(name):
    """These made the framing give up the connection: aiohttp then had what followed a
    `Connection: close` request in the same read, and refused it in place of that request's
    answer. The requests framed here are those both of aiohttp's parsers read."""
    stream = KEEP + FRAMED_AS_AIOHTTP_FRAMES[name] + GET
    read = [targets_read(cls, stream) for cls in aiohttp_parsers()]
    assert read[0] is not None and all(r == read[0] for r in read), read
    for seed in range(30):
        rec = Recorder()
        assert rec.feed_in_chunks(stream, random.Random(seed)) == b""
        assert not rec.framing.lost and bytes(rec.forwarded) == stream and rec.framing.idle, seed
        assert [t for t, _, _ in rec.seen] == read[0], seed
    rec = Recorder()  # a byte at a time: a CR before an empty line's LF has come, too
    for i in range(len(stream)):
        assert rec.framing.feed(stream[i:i + 1]) == b""
    assert not rec.framing.lost and bytes(rec.forwarded) == stream and [t for t, _, _ in rec.seen] == read[0]


@pytest.mark.parametrize("name", list(GIVEN_UP_AS_AIOHTTP_FRAMES_THEM_OTHERWISE) + ["an absolute target"])
def test_a_head_aiohttp_frames_otherwise_or_refuses_stays_given_up(name):
    """When unsure, given up: two parsers of one stream must agree (README "Limits")."""
    case = GIVEN_UP_AS_AIOHTTP_FRAMES_THEM_OTHERWISE.get(name, ABSOLUTE_TARGET)
    stream = KEEP + case + GET
    reads = [targets_read(cls, stream) for cls in aiohttp_parsers()]
    if case is not ABSOLUTE_TARGET and (LLHTTP_PARSER is not None or "llhttp alone" not in name):
        assert any(r is None or len(r) != 3 for r in reads), reads
    rec = Recorder()
    rec.framing.feed(stream)
    assert rec.framing.lost and bytes(rec.forwarded) == stream and [t for t, _, _ in rec.seen] == [b"/keep"]
