"""What the request framing reads of a head (parse_head): its framing, what it refuses to frame,
whether it ends its connection as aiohttp's parser in use reads it, and the memo of heads parsed."""
import asyncio

import pytest
from aiohttp import http_parser
from aiohttp.base_protocol import BaseProtocol

from aclserve.server import framing
from aclserve.server.framing import parse_head
from aclserve.server.request_head import ends_connection


def test_parse_head_reads_framing_and_refuses_what_it_cannot_frame():
    head, length = parse_head(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\n"
                              b"Inference-Header-Content-Length: 7")
    assert (head.method, head.target, head.version, length) == (b"POST", b"/v2/models/m/infer", b"HTTP/1.1", 12)
    assert head.header(b"inference-header-content-length") == b"7" and head.header(b"expect") is None
    assert parse_head(b"GET / HTTP/1.1\r\nHost: x")[1] == 0
    # zeros first past int()'s 4,300 digits: read as 406 (it raised ValueError out of data_received: a review)
    assert parse_head(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"0" * 5000 + b"406")[1] == 406
    assert parse_head(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"0" * 5000)[1] == 0
    for bad in (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked",
                b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket",
                b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6",
                b"POST / HTTP/1.1\r\nContent-Length: -5",
                b"POST /\r\nHost: x",
                b"POST / HTTP/1.1\r\nContent-Length : 5",
                b"POST / HTTP/1.1\r\nHost: a\nContent-Length: 5"):  # a bare LF inside a complete head
        assert parse_head(bad) is None, bad


def test_a_repeated_head_is_parsed_once_and_the_memo_stays_bounded():
    raw = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: memo-test\r\nContent-Length: 12"  # this test's own
    first = parse_head(raw)
    assert parse_head(bytes(bytearray(raw))) is first  # equal bytes, another object: the same Head
    assert parse_head(raw.replace(b"12", b"13"))[0] is not first[0]  # any other byte: parsed anew
    first[0].memo["reader"] = 1
    assert parse_head(raw)[0].memo == {"reader": 1}
    del first[0].memo["reader"]  # the memo is the process's: leave nothing behind
    bad = b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6"
    assert parse_head(bad) is None and parse_head(bad) is None  # refusals are kept too
    for i in range(framing.MEMO_HEADS + 10):  # a flood of new heads: the memo is emptied, not grown
        assert parse_head(b"GET /%d HTTP/1.1\r\nHost: x" % i)[0].target == b"/%d" % i
        assert len(framing._parsed) <= framing.MEMO_HEADS
    long = b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * framing.MEMO_HEAD_BYTES
    assert parse_head(long)[0] is not parse_head(long)[0]  # a long head is parsed each time
    assert long not in framing._parsed


def test_a_head_says_whether_its_request_ends_the_connection_as_llhttp_reads_it():
    cases = {(b"HTTP/1.1", b""): False, (b"HTTP/1.1", b"\r\nConnection: close"): True,
             (b"HTTP/1.1", b"\r\nConnection: Keep-Alive ,\tCLOSE"): True,
             (b"HTTP/1.1", b"\r\nConnection: keep-alive\r\nConnection: close"): True,
             (b"HTTP/1.1", b"\r\nProxy-Connection: close"): True, (b"HTTP/1.1", b"\r\nConnection: closed"): False,
             (b"HTTP/1.1", b"\r\nX-Connection: close"): False, (b"HTTP/1.0", b""): True,
             (b"HTTP/1.0", b"\r\nConnection: keep-alive"): False,
             (b"HTTP/1.0", b"\r\nProxy-Connection: Keep-Alive"): False}
    for (version, lines), closes in cases.items():
        raw = b"GET / %s\r\nHost: t%s" % (version, lines)
        assert parse_head(raw)[0].closes is closes, raw


CLOSING_LINES = (b"", b"\r\nConnection: close", b"\r\nConnection: Keep-Alive ,\tCLOSE", b"\r\nConnection: keep-alive",
                 b"\r\nConnection: keep-alive\r\nConnection: close", b"\r\nProxy-Connection: close",
                 b"\r\nProxy-Connection: Keep-Alive", b"\r\nConnection: closed", b"\r\nX-Connection: close",
                 b"\r\nConnection: foo, close", b"\r\nConnection: keep-alive\r\nProxy-Connection: close",
                 b"\r\nConnection: , ,keep-alive", b"\r\nConnection: upgrade")


@pytest.mark.parametrize("parser", ["HttpRequestParserC", "HttpRequestParserPy"])
def test_a_head_ends_its_connection_as_the_aiohttp_parser_in_use_reads_it(parser):
    """The guard read every head by llhttp's rule; with aiohttp's Python parser in use
    (AIOHTTP_NO_EXTENSIONS=1), which reads Proxy-Connection not at all and lets `close` win on
    HTTP/1.0, a request it kept the connection open for had what came after it dropped here, and
    one it closed had the next request passed on, its 400 in place of the first answer (a
    reviewer). Each rule, against that parser itself."""
    cls = getattr(http_parser, parser, None)
    if cls is None or (parser.endswith("C") and cls is http_parser.HttpRequestParserPy):
        pytest.skip("aiohttp's C parser is not built here")
    loop = asyncio.new_event_loop()
    try:
        for version in (b"HTTP/1.1", b"HTTP/1.0"):
            for lines in CLOSING_LINES:
                raw = b"GET / %s\r\nHost: t%s" % (version, lines)
                [(message, _)], _, _ = cls(BaseProtocol(loop), loop, 2**16).feed_data(raw + b"\r\n\r\n")
                assert ends_connection(parse_head(raw)[0], llhttp=parser.endswith("C")) is message.should_close, raw
    finally:
        loop.close()


def test_a_head_of_128_headers_is_framed_and_one_of_129_given_up():
    """aiohttp's parser takes 128 headers and refuses 129 (`Too many headers received`): the
    framing refused 128 too, so such a request lost the guard (answered by aiohttp, the same 200)."""
    def head(headers: int) -> bytes:
        return b"GET / HTTP/1.1\r\nHost: x" + b"".join(b"\r\nX-%d: v" % i for i in range(headers - 1))
    assert parse_head(head(128)) is not None
    assert parse_head(head(129)) is None
