"""The markers libjpeg meets after a JPEG's first scan header, found as libjpeg finds them.

After a scan header, and after every segment, libjpeg looks for the next marker: the first 0xFF
followed by a byte other than 0x00 (a 0xFF of the entropy-coded data, stuffed) and 0xFF (fill
before a marker); the bytes before it are the scan's data, or garbage it skips. A restart marker
(RST0-7) or TEM has no segment and it looks on; every other marker has one, whose length it
skips whatever the segment holds. So a comment holding the bytes FF D9 ends nothing: counting
FF DA and FF D9 wherever they lay let 1,500 scans through after such a comment (a 140 KB
4000 x 4000 picture held a decode thread 36 s; found by tester t88).
The search runs on the server's event loop (header.probe, to charge the decode) and again in a decode
thread (decode_pixels probes): in numpy, each byte looked at once, never what a segment's length
skips, a window at a time (between windows the interpreter may switch threads): 70 ms for 64 MB
whatever the bytes, where a regular expression, holding the interpreter lock throughout, took
0.25-0.6 s for 64 MB of FF 00 pairs, restart markers or FF bytes (2026-12-07, a loaded 2-core VM).
Pure functions over bytes.
"""
from __future__ import annotations

import struct
from collections.abc import Iterator

import numpy as np

SOS, EOI, SOI = 0xDA, 0xD9, 0xD8
_RST0, _TEM = 0xD0, 0x01
_LENGTH = struct.Struct(">H")
# the bytes searched for the next marker at first, doubled up to the largest: a marker a few bytes
# on costs a small window, a scan of 64 MB 64 of the largest
_FIRST_WINDOW, _LARGEST_WINDOW = 4096, 1 << 20


def markers_after_first_scan(data, pos: int) -> Iterator[int]:
    """The markers (their second byte) libjpeg meets after the scan header whose length is at
    `pos`, each segment skipped by its length, up to the end of the picture (EOI, not yielded:
    bytes after it, a phone's video or an appended picture, are not read), a second SOI (libjpeg
    stops there: "two SOI markers") or the end of the bytes."""
    data = np.frombuffer(data, np.uint8)  # (no copy)
    n = len(data)
    while pos + 2 <= n:
        (length,) = _LENGTH.unpack_from(data, pos)
        # (a length under 2 skips only itself, as libjpeg's skip_variable: never backwards)
        found = _next_marker(data, pos + max(length, 2))
        if found < 0:
            return
        marker = int(data[found + 1])
        if marker in (EOI, SOI):
            return
        yield marker
        pos = found + 2


def _next_marker(data: np.ndarray, start: int) -> int:
    """Where the next marker with a segment begins at or after `start`, else -1: FF, then neither
    00 nor FF (stuffed data, fill) nor RST0-7, TEM (no segment)."""
    window = _FIRST_WINDOW
    while start + 1 < len(data):
        part = data[start:start + window + 1]
        following = part[1:]
        found = ((part[:-1] == 0xFF) & (following != 0) & (following != 0xFF) & (following != _TEM)
                 & ((following - np.uint8(_RST0)) > 7))  # (uint8: below RST0 wraps past 7)
        at = int(found.argmax())
        if found[at]:
            return start + at
        start += len(part) - 1
        window = min(2 * window, _LARGEST_WINDOW)
    return -1
