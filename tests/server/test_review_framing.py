"""Review of the linear hold-back in RequestFraming (`_still_short`, `_held_need`) and of the
head held for its body being offered once more, with the body: bytes pass on unchanged and in
order whatever the chunking, down to single bytes."""
import random

from aclserve.server.framing import ANSWERED, FORWARD, NEED_BODY, RequestFraming


def post(path: bytes, body: bytes) -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (path, len(body), body)


def requests(rng: random.Random) -> list[tuple[bytes, bytes]]:
    """(target, request) pairs, targets unique; /drop bodies hold CRLF CRLF to mislead a search."""
    made = []
    for i in range(rng.randint(1, 8)):
        kind = rng.choice((b"get", b"keep", b"drop", b"drop"))
        target = b"/%s/%d" % (kind, i)
        if kind == b"get":
            made.append((target, b"GET %s HTTP/1.1\r\nHost: t\r\n\r\n" % target))
        else:
            body = b"\r\n\r\n" * rng.randint(0, 4) + b"b" * rng.randint(0, 30) if kind == b"drop" else b"k" * rng.randint(0, 30)
            made.append((target, post(target, body)))
    return made


def run(chunks, made, want_body: bool, wanted=lambda: True, pause=None):
    forwarded, answered, asked, needed = bytearray(), set(), [], set()
    bodies = {t: r.split(b"\r\n\r\n", 1)[1] for t, r in made}

    def answer(head, length, body):
        asked.append((head.target, body is not None))
        # a body comes whole: at once when it came with its head, else after NEED_BODY
        assert body is None or bytes(body) == bodies[head.target]
        assert body is not None or head.target not in needed  # asked for, it comes with the body
        if not head.target.startswith(b"/drop"):
            return FORWARD
        if want_body and body is None:
            needed.add(head.target)
            return NEED_BODY
        assert body is None or bytes(body) == bodies[head.target]
        answered.add(head.target)
        return ANSWERED

    framing = RequestFraming(forwarded.extend, answer, pause or (lambda: False), wanted)
    for chunk in chunks:
        assert framing.feed(chunk) == b""
    assert framing.idle and not framing.lost
    assert len(asked) == len(set(asked)), asked  # a head is asked at most once without its body, once with
    assert bytes(forwarded) == b"".join(r for t, r in made if t not in answered)
    return answered


def test_every_two_chunk_split_of_a_pipelined_stream_passes_on_the_same_bytes():
    made = [(b"/drop/0", post(b"/drop/0", b"\r\n\r\nxy")), (b"/keep/1", post(b"/keep/1", b"k")),
            (b"/get/2", b"GET /get/2 HTTP/1.1\r\nHost: t\r\n\r\n"), (b"/drop/3", post(b"/drop/3", b""))]
    stream = b"".join(r for _, r in made)
    for want_body in (False, True):
        for cut in range(1, len(stream)):
            assert run([stream[:cut], stream[cut:]], made, want_body) == {b"/drop/0", b"/drop/3"}, cut


def test_random_small_chunks_and_heads_offered_or_not_pass_on_the_same_bytes():
    for seed in range(3000):
        rng = random.Random(seed)
        made = requests(rng)
        stream = b"".join(r for _, r in made)
        chunks, pos, most = [], 0, rng.choice((1, 2, 3, 7, 50, 400))
        while pos < len(stream):
            n = rng.randint(1, most)
            chunks.append(stream[pos:pos + n])
            pos += n
        share = rng.choice((1.0, 0.5, 0.0))  # wanted() switches between calls
        answered = run(chunks, made, rng.random() < 0.5, lambda: rng.random() < share)
        if share == 1.0:
            assert answered == {t for t, _ in made if t.startswith(b"/drop")}, seed


def test_a_bare_line_feed_is_seen_whichever_chunk_its_line_began_in():
    head = b"GET / HTTP/1.1\r\nHost: t\r\nX: y"
    for tail, lost in ((b"\n\r\n", True), (b"\r\n\r\n", False)):  # CR and LF in different chunks too
        stream = head + tail
        for cut in range(1, len(stream)):
            for second in range(cut + 1, len(stream) + 1):
                forwarded = bytearray()
                framing = RequestFraming(forwarded.extend, lambda h, n, b: FORWARD, lambda: False)
                for chunk in (stream[:cut], stream[cut:second], stream[second:]):
                    if chunk:
                        framing.feed(chunk)
                assert framing.lost is lost and bytes(forwarded) == stream, (cut, second)
