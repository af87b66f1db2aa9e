"""A RequestFraming run by a recorder, and the requests the framing tests feed it (test_framing*.py)."""
import random

from aclserve.server.framing import ANSWERED, FORWARD, NEED_BODY, RequestFraming


def post(path: bytes, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: t\r\n%sContent-Length: %d\r\n\r\n%s" % (path, extra, len(body), body)


GET = b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n"
KEEP = post(b"/keep", b"k" * 300)
DROP = post(b"/drop", b"d" * 5000)


class Recorder:
    """Runs a framing whose answer drops /drop requests (optionally after seeing the body)."""

    def __init__(self, want_body: bool = False, pause_after_answer: bool = False, offered: bool = True):
        self.forwarded = bytearray()
        self.seen: list[tuple[bytes, int, bytes | None]] = []
        self.want_body = want_body
        self.pause = pause_after_answer
        self.answered = 0
        self.framing = RequestFraming(self.forwarded.extend, self.answer, lambda: self.pause and self.answered > 0,
                                      lambda: offered)  # offered False: heads only measured

    def answer(self, head, length, body):
        self.seen.append((head.target, length, body))
        if head.target != b"/drop":
            return FORWARD
        if self.want_body and body is None:
            return NEED_BODY
        self.answered += 1
        return ANSWERED

    def feed_in_chunks(self, stream: bytes, rng: random.Random) -> bytes:
        pos, rest = 0, b""
        while pos < len(stream):
            n = rng.randint(1, 700)
            rest += self.framing.feed(stream[pos:pos + n])
            pos += n
        return rest
