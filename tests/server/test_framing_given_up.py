"""What the request framing cannot frame as aiohttp would goes to aiohttp from there on, at once
(garbage, a method aiohttp does not know, a head that can never be one aiohttp takes), the
requests before it first and in a call of their own; a head still short of aiohttp's limits is held."""
from aclserve.server.framing import FORWARD, RequestFraming, parse_head

from .framing_recorder import DROP, GET, KEEP, Recorder, post


def test_what_cannot_be_framed_goes_to_aiohttp_from_there_on():
    chunked = b"POST /drop HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    rec = Recorder()
    rec.framing.feed(KEEP + chunked + DROP)
    assert rec.framing.lost and bytes(rec.forwarded) == KEEP + chunked + DROP
    endless = Recorder()
    endless.framing.feed(b"GET / HTTP/1.1\r\nX: " + b"a" * 20000)
    assert endless.framing.lost and len(endless.forwarded) > 20000


def test_bytes_that_cannot_begin_a_request_go_to_aiohttp_at_once():
    """aiohttp's parser refuses at the first byte that cannot begin a request (its methods are
    upper case), so garbage, or a body sent past its Content-Length, is answered 400 at once
    there. Framing held such bytes until a blank line came, and the client waited for the
    header timeout (from a differential fuzz against aiohttp alone). A request before them is
    passed on in a call of its own: aiohttp drops the requests it read in a call that fails."""
    for garbage in (b"x", b"{\"inputs\": []}", b"GARBAGE\r\n", b"post / HTTP/1.1\r\n", b"\x16\x03\x01",
                    b"DEADBEEF", b"HELLO", b"GET\t/ HTTP/1.1\r\n", b"GET / HTTP/2\r\n"):
        rec = Recorder()
        rec.framing.feed(KEEP + garbage)
        assert rec.framing.lost, garbage
        assert bytes(rec.forwarded) == KEEP + garbage
        pieces = []
        split = RequestFraming(pieces.append, lambda *a: FORWARD, lambda: False)
        split.feed(KEEP + garbage)
        assert pieces == [KEEP, garbage]
    for byte_by_byte in (b"x", b"GARBAGE\r\nHost: t", b"POSTAL", b"POST / HTTP/1.1 x\r\n"):
        rec = Recorder()
        rec.framing.feed(KEEP[:10])
        rec.framing.feed(KEEP[10:])
        for i in range(len(byte_by_byte)):
            rec.framing.feed(byte_by_byte[i:i + 1])
        assert rec.framing.lost and bytes(rec.forwarded) == KEEP + byte_by_byte
    for start in (b"P", b"M-SEA", b"POST /v2/mod", b"POST /keep HTTP/1.1\r\nHost: t\r\nContent-Le"):  # begun
        rec = Recorder()
        for i in range(len(start)):
            rec.framing.feed(start[i:i + 1])
        assert not rec.framing.lost and not rec.forwarded, start


def test_a_whole_head_of_a_method_aiohttp_does_not_frame_alike_goes_to_aiohttp_from_there_on():
    """A head whose method aiohttp's parser does not know (400 there) was framed here once whole
    (only a head still coming was checked), so the requests before it reached aiohttp with it in
    one call, whose failure lost their answers; CONNECT's Content-Length was taken as its body,
    which llhttp reads as new requests (an upgrade): a request hidden there was answered by
    aiohttp while the guard answered the next one itself (a reviewer)."""
    hidden = post(b"/drop", GET)
    connect = b"CONNECT t:80 HTTP/1.1\r\nHost: t:80"
    for head in (b"FOO / HTTP/1.1\r\nHost: t", connect + b"\r\nContent-Length: %d" % len(hidden), connect,
                 b"PRI / HTTP/1.1\r\nHost: t"):
        assert parse_head(head) is None, head
        after = head + b"\r\n\r\n" + hidden + DROP
        pieces = []
        framing = RequestFraming(pieces.append, lambda *a: FORWARD, lambda: False)
        framing.feed(KEEP + after)
        assert framing.lost and pieces == [KEEP, after], head
        rec = Recorder()  # (/drop requests are answered by the recorder: none of them is here)
        rec.framing.feed(KEEP + after)
        assert rec.answered == 0 and bytes(rec.forwarded) == KEEP + after


UNFINISHED_HEADS_AIOHTTP_REFUSES = {  # no blank line yet, and none can make these heads aiohttp takes
    "the blank line forgotten before a JSON body": b"POST /k HTTP/1.1\r\nHost: t\r\nContent-Length: 14\r\n"
                                                  b"{\"inputs\": []}",
    "a header line over 8190 bytes": b"POST /k HTTP/1.1\r\nHost: t\r\nX: " + b"a" * 9000,
    "a request line over 8190 bytes": b"GET /" + b"a" * 9000,
    "two header names in a row over 8190 bytes": b"GET / HTTP/1.1\r\n" + b"N" * 8180 + b": v\r\nContent-Len",
    "a NUL in a value": b"POST /k HTTP/1.1\r\nHost: t\r\nX: a\x00b\r\n",
    "a space before the colon": b"POST /k HTTP/1.1\r\nHost: t\r\nContent-Length : 5\r\n",
    "a space in a name still coming": b"POST /k HTTP/1.1\r\nHost: t\r\nX Y",
    "an empty name": b"POST /k HTTP/1.1\r\nHost: t\r\n: v\r\n",
    "a line without a colon": b"POST /k HTTP/1.1\r\nHost: t\r\nGarbage\r\n",
    "a folded line": b"POST /k HTTP/1.1\r\nHost: t\r\nX: a\r\n b",
    "a bare CR in a value": b"POST /k HTTP/1.1\r\nHost: t\r\nX: a\rb\r\nContent-Length: 5\r\n",
    "a bare CR at a line's start": b"POST /k HTTP/1.1\r\nHost: t\r\n\rX: 1\r\n",
    "130 headers": b"POST /k HTTP/1.1\r\n" + b"".join(b"X%d: 1\r\n" % i for i in range(130)),
}


def test_an_unfinished_head_that_can_never_be_one_aiohttp_takes_goes_to_aiohttp_at_once():
    """aiohttp's parser answers 400 at the first line it refuses; framing read only the request
    line of a head without its blank line, held the rest, and the client waited for the header
    timeout with no answer (a tester's scripts against the guard and plain aiohttp). Whether
    the head comes in one read or a byte at a time, the request before it is passed on first."""
    for name, head in UNFINISHED_HEADS_AIOHTTP_REFUSES.items():
        for piece in (len(head), 1, 700):
            pieces = []
            split = RequestFraming(pieces.append, lambda *a: FORWARD, lambda: False)
            split.feed(KEEP)
            for i in range(0, len(head), piece):
                split.feed(head[i:i + piece])
            assert split.lost, (name, piece)
            assert b"".join(pieces) == KEEP + head and pieces[0] == KEEP, (name, piece)


def test_an_unfinished_head_at_aiohttp_s_limits_is_held_and_framed_whatever_its_pieces():
    """Heads that reach the limits and stop short of them: held until their blank line, then
    framed (offered, passed on) as any other, however they were split."""
    at_limits = {  # what has come: what completes it
        b"POST /k HTTP/1.1\r\nHost: t\r\n" + b"".join(b"X%d: 1\r\n" % i for i in range(125))
        + b"X-Last: \x80\xff\t!~ v\r\nX-" + b"n" * 8150: b": v\r\n\r\n",  # 128 headers, aiohttp's most
        b"GET /" + b"a" * 8176 + b" HTTP/1.1\r\nH": b"ost: t\r\n\r\n",  # a request line of 8,190
        b"GET / HTTP/1.1\r\nHost: t\r\n" + b"N" * 8176 + b": v\r\nContent-Len": b"gth: 0\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: t\r\nX: " + b"v" * 8187 + b"\r": b"\n\r\n",  # a line of 8,190
    }
    for head, rest in at_limits.items():
        for piece in (len(head), 1, 700):
            rec = Recorder()
            for i in range(0, len(head), piece):
                rec.framing.feed(head[i:i + piece])
            assert not rec.framing.lost and not rec.forwarded, (head[:40], piece)
            rec.framing.feed(rest)
            assert not rec.framing.lost and bytes(rec.forwarded) == head + rest and len(rec.seen) == 1
