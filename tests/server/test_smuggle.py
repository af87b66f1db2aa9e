"""Differential review of the guard's framing against aiohttp's parser (direct_infer on, and
off as the reference): the same bytes to both, raw sockets, the same answers and the connection
kept or closed alike. Both cases failed before their fixes: the guard answered directly (200,
connection kept) where aiohttp answered once and closed, or refused the head (400)."""
import asyncio

import pytest

from aclserve.server.framing import parse_head

from .test_review_direct import everything, raw_post, statuses

H = b"Host: t"


def both(pair, data: bytes) -> tuple[bytes, bytes]:
    on, off = pair
    async def run():
        return await asyncio.gather(everything(off.url, data), everything(on.url, data))
    return asyncio.run(run())


@pytest.mark.parametrize("value", [b"close", b"Close", b"keep-alive, close", b"\tclose\t"])
def test_proxy_connection_close_ends_the_connection_as_in_aiohttp(pair, value):
    """llhttp reads Proxy-Connection as Connection: `close` there ends the connection after
    aiohttp's answer ("Data after `Connection: close`" for what follows in the same read). The
    guard answered it directly, kept the connection and answered the next request too."""
    first = raw_post([H, b"Proxy-Connection: " + value])
    via_aiohttp, direct = both(pair, first)
    assert statuses(via_aiohttp) == [200] and not via_aiohttp.endswith(b"<open>")
    assert statuses(direct) == [200], direct[-300:]
    assert not direct.endswith(b"<open>")
    via_aiohttp, direct = both(pair, first + raw_post([H]))
    assert (statuses(direct), direct.endswith(b"<open>")) == (statuses(via_aiohttp), via_aiohttp.endswith(b"<open>"))


@pytest.mark.parametrize("name_bytes", [8177, 8180])
def test_a_header_name_aiohttp_refuses_with_the_next_one_is_not_answered_directly(pair, name_bytes):
    """aiohttp's C parser counts a header's name with the previous header's (its name is let go
    only once the next name has been measured): 8,177 bytes of name then `Content-Length` is a
    400 there, though every line is within 8,190 bytes."""
    data = raw_post([H, b"X" * name_bytes + b": v"]) + raw_post([H])
    via_aiohttp, direct = both(pair, data)
    assert statuses(via_aiohttp) == [400] and not via_aiohttp.endswith(b"<open>")
    assert statuses(direct) == [400], direct[-300:]
    assert not direct.endswith(b"<open>")


def test_long_header_names_aiohttp_accepts_are_still_framed():
    head = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: t\r\n%s: v\r\nContent-Length: 2"
    assert parse_head(head % (b"X" * 8176))[1] == 2  # 8,176 + 14 (Content-Length) = 8,190
    assert parse_head(head % (b"X" * 8177)) is None
    assert parse_head(b"POST / HTTP/1.1\r\nHost: t\r\nX: " + b"v" * 8187)[1] == 0  # a line of 8,190


@pytest.mark.parametrize("garbage", [b"x", b'{"inputs": []}', b"GARBAGE\r\n", b"DEADBEEF"])
def test_bytes_that_cannot_begin_a_request_are_answered_400_at_once(pair, garbage):
    """aiohttp answers 400 and closes at the first byte that cannot begin a request; the guard
    held such bytes until the header timeout (10 s), with no answer. A request before them on
    the connection is answered first (aiohttp alone drops it when both come in one read: this
    side of the guard differs from aiohttp on purpose)."""
    via_aiohttp, direct = both(pair, garbage)
    assert statuses(via_aiohttp) == [400] and not via_aiohttp.endswith(b"<open>")
    assert statuses(direct) == [400] and not direct.endswith(b"<open>"), direct[-300:]
    for first in (raw_post([H]), b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n"):  # direct, aiohttp's
        _, direct = both(pair, first + garbage)
        assert statuses(direct) == [200, 400] and not direct.endswith(b"<open>"), direct[-300:]
