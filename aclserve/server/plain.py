"""Which requests the connection guard (connections.py) may answer itself, before aiohttp:
the rules its early refusals (shedding.py) and its direct answers (direct.py) share.

An infer path whose names need no decoding (aiohttp's router reads the others), over HTTP/1.1,
with no `Expect` (aiohttp answers those before its middlewares), while inference needs no API
token; and for the early refusals, which are not observed, while neither tracing nor the request
log wants every request, and on a connection the client keeps (a refusal holds it: shedding.py).
A request that ends its connection (`Connection: close`: request_head.py) may be answered
directly: its answer says so, and the connection closes after it.
"""
from __future__ import annotations

from .request_head import Head

_PREFIX = b"/v2/models/"
_SUFFIX = b"/infer"


def infer_target(target: bytes) -> tuple[str, str | None] | None:
    """(model, version or None) of an infer path, or None (another route, or a name that
    needs decoding: aiohttp's router reads those)."""
    path = target.split(b"?", 1)[0]
    # braces: no route of aiohttp's matches them; a fragment: aiohttp drops it
    if (not path.startswith(_PREFIX) or not path.endswith(_SUFFIX) or b"%" in path
            or b"{" in path or b"}" in path or b"#" in path):
        return None
    parts = path[len(_PREFIX):-len(_SUFFIX)].split(b"/")
    try:
        if len(parts) == 1 and parts[0]:
            return parts[0].decode(), None
        if len(parts) == 3 and parts[0] and parts[1] == b"versions" and parts[2]:
            return parts[0].decode(), parts[2].decode()
    except UnicodeDecodeError:
        pass
    return None


def guard_may_answer(head: Head, state) -> bool:
    """The head and the server's state allow the guard to answer this request itself (the
    caller checks the path with infer_target and its own limits). `state`: the ServerState.
    Traced and logged requests too: the infer path (infer_pipeline.counted_infer) observes them as it
    does on aiohttp's path, their id read from the head."""
    return not state.auth.inference and head.derived("plain", _head_allows)


def guard_may_refuse(head: Head, state) -> bool:
    """guard_may_answer, for the early refusals (shedding.py), which are not observed: not
    while tracing or the request log want every request (a refusal there has no log line),
    nor for a request that ends its connection (a refusal keeps it: aiohttp's path closes it)."""
    return state.observer is None and not head.closes and guard_may_answer(head, state)


def _head_allows(head: Head) -> bool:
    """HTTP/1.1, no Expect (once per Head: framing's memo)."""
    return head.version == b"HTTP/1.1" and head.header(b"expect") is None
