"""Request framing in front of aiohttp: bytes pass through unchanged and in order, whatever the
chunking, and a request answered here is dropped whole."""
import random

from aclserve.server.framing import FORWARD, RequestFraming

from .framing_recorder import DROP, GET, KEEP, Recorder, post


def test_a_body_that_came_with_its_head_is_offered_with_it_at_once():
    rec = Recorder(want_body=True)
    assert rec.framing.feed(DROP + KEEP) == b""
    assert rec.seen == [(b"/drop", 5000, b"d" * 5000), (b"/keep", 300, b"k" * 300)]  # one offer each
    rec = Recorder(want_body=True)
    rec.framing.feed(DROP[:-10])  # the body still arriving: offered without it, held, then with it
    rec.framing.feed(DROP[-10:])
    assert [(t, n, b if b is None else bytes(b)) for t, n, b in rec.seen] == [
        (b"/drop", 5000, None), (b"/drop", 5000, b"d" * 5000)]
    assert bytes(rec.forwarded) == b"" and rec.answered == 1


def test_forwarded_requests_pass_through_unchanged_whatever_the_chunks():
    stream = b"".join([GET, KEEP, GET, KEEP, KEEP])
    for seed in range(50):
        rec = Recorder()
        assert rec.feed_in_chunks(stream, random.Random(seed)) == b""
        assert bytes(rec.forwarded) == stream
        assert [t for t, _, _ in rec.seen] == [b"/v2/health/ready", b"/keep", b"/v2/health/ready", b"/keep", b"/keep"]
        assert rec.framing.idle


def test_a_whole_chunk_is_passed_on_as_it_is():
    pieces = []
    framing = RequestFraming(pieces.append, lambda head, n, body: FORWARD, lambda: False)
    chunk = KEEP + GET
    framing.feed(chunk)
    assert pieces == [chunk] and pieces[0] is chunk


def test_answered_requests_are_dropped_with_their_bodies():
    stream = b"".join([KEEP, DROP, GET, DROP, DROP, KEEP])
    for want_body in (False, True):
        for seed in range(50):
            rec = Recorder(want_body=want_body)
            rec.feed_in_chunks(stream, random.Random(seed))
            assert bytes(rec.forwarded) == KEEP + GET + KEEP
            assert rec.answered == 3
            if want_body:  # asked again with the whole body once it had come
                assert [b for t, _, b in rec.seen if t == b"/drop" and b is not None] == [b"d" * 5000] * 3


def test_after_a_pausing_answer_the_rest_of_the_chunk_is_handed_back():
    rec = Recorder(pause_after_answer=True)
    rest = rec.framing.feed(KEEP + DROP + GET + KEEP)
    assert bytes(rec.forwarded) == KEEP and rest == GET + KEEP
    rec.pause = False
    rec.framing.feed(rest)  # fed again when the hold ends
    assert bytes(rec.forwarded) == KEEP + GET + KEEP


def test_a_body_that_is_still_arriving_when_paused_is_dropped_as_it_comes():
    rec = Recorder(pause_after_answer=True)
    half = len(DROP) // 2
    assert rec.framing.feed(DROP[:half]) == b""
    assert not rec.framing.idle
    rec.pause = False
    rec.framing.feed(DROP[half:] + GET)
    assert bytes(rec.forwarded) == GET and rec.framing.idle


def test_nothing_after_a_request_that_ends_the_connection_is_passed_on_whatever_the_chunks():
    """aiohttp's parser refuses every byte after it (`Data after Connection: close`), in place
    of the answers due from that read."""
    closing_keep = post(b"/keep", b"c" * 300, b"Connection: close\r\n")
    closing_drop = post(b"/drop", b"c" * 5000, b"Proxy-Connection: Close\r\n")
    for closing in (closing_keep, closing_drop):
        for offered in (True, False):
            for seed in range(30):
                rec = Recorder(offered=offered)
                assert rec.feed_in_chunks(KEEP + closing + GET + KEEP + b"\r\n", random.Random(seed)) == b""
                answered = offered and closing is closing_drop
                assert bytes(rec.forwarded) == KEEP + (b"" if answered else closing)
                assert rec.framing.closed and rec.answered == answered
