"""Python's cycle collector, set for a server process.

CPython runs a young-generation collection each time the objects it tracks outnumber those
freed by 700. A server with many requests in flight keeps thousands of young objects alive
(coroutines, futures, requests, decoded tensors), so at the default it collects every few
requests and walks them all each time: measured with `tools/bench_server.py`-style runs of
the light MLP, KServe v2 JSON at 64 clients on one core, 104-108 us of server CPU a request at
700 against 94-97 at 5,000, 20,000 or 50,000 (medium CNN binary: within noise, 0-3 %).
Garbage in reference cycles is still collected, only less often; full collections keep their
own rule (CPython 3.10-3.13: a quarter more long-lived objects than at the last one; 3.14's
incremental collector has rules of its own and was not measured here).
"""
from __future__ import annotations

import gc

YOUNG_THRESHOLD = 5000


def tune_for_server() -> None:
    """Raise the young-generation threshold to YOUNG_THRESHOLD (never lower it: an explicit
    higher setting wins). Process-wide: `aclserve serve` calls it at start."""
    young, middle, old = gc.get_threshold()
    if young and young < YOUNG_THRESHOLD:  # 0: the collector is off, leave it so
        gc.set_threshold(YOUNG_THRESHOLD, middle, old)
