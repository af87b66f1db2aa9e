"""Transparent huge pages as the kernel gives them (_memory.py advises its large device allocations
for them): its mode, and the bytes it backs with huge pages in given regions, read from
/proc/self/smaps on demand (pages are only backed once touched)."""
from __future__ import annotations

import re

_SMAPS_RANGE = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) ")


def _mode() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
    except OSError:
        return "unavailable"
    m = re.search(r"\[(\w+)\]", text)
    return m.group(1) if m else "unavailable"


MODE = _mode()  # always, madvise, never, or unavailable


def backed(regions) -> dict:
    """{owner: bytes backed by huge pages} of the (start, end, owner) regions, sorted by start."""
    out: dict = {}
    if not regions:
        return out
    owner = None
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                m = _SMAPS_RANGE.match(line)
                if m:
                    lo, hi = int(m.group(1), 16), int(m.group(2), 16)
                    owner = next((d for s, e, d in regions if s < hi and e > lo), None)
                elif owner is not None and line.startswith("AnonHugePages:"):
                    out[owner] = out.get(owner, 0) + int(line.split()[1]) * 1024
    except OSError:
        pass
    return out
