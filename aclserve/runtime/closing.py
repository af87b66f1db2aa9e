"""Closing the Python API's pools to the end, whatever Ctrl-C does (Engine.close, a failed load).

A pool's close waits for the device, up to its instances' reset_timeout_ms (10 s). Ctrl-C came
through only after it (6 to 10 s late), and one raised inside it would stop an instance's close
midway: neither freed nor abandoned, its work not counted as running, the runtime could reset
the device or finalize ACL under it. So the closes run in a thread of their own and the caller's
thread waits for them: Ctrl-C there brings their deadline to now (InstancePool.hurry: what the
device still runs is abandoned, teardown.py, after teardown.GRACE_S) and is raised once they are
done, in about half a second. The pools close side by side (teardown.close_at_once), so the
whole close has one grace: one after another, each busy pool granted its own (tester t46: 8 busy
models, close(timeout=0) took 4 s, and so did Ctrl-C). Where no thread can be started (an
atexit handler on CPython 3.12.0 and 3.12.1, which refuse new threads at interpreter shutdown:
the Engine's exit close; a host out of threads) the closes run in the caller's thread instead:
closed all the same, Ctrl-C aside. Once they are done the heap is trimmed (heap.trim): without it
an Engine loading and closing models grew with every cycle, 80 to 158 MB in 150 of a medium CNN,
though nothing leaked.
"""
from __future__ import annotations

import functools
import threading
import time

from .. import heap
from ..daemon_threads import run_in_thread
from .teardown import close_at_once


def close_pools(pools: list, deadline: float | None, interrupted: bool = False) -> None:
    """Close `pools` side by side (blocking), each waiting for the device until `deadline`
    (time.monotonic(); None: each instance's reset_timeout_ms). `interrupted`: Ctrl-C has come
    already (in a wait before this), so the device is not waited for beyond the grace. A
    KeyboardInterrupt while they close hurries them and is raised once they are done; else a
    pool's error, once all have closed."""
    if interrupted:
        deadline = time.monotonic()
    errors: list[Exception] = []
    done = threading.Event()

    def close_all() -> None:
        try:
            errors.extend(close_at_once([functools.partial(pool.close, deadline) for pool in pools]))
            heap.trim()  # the freed sessions and buffers back to the system, as the repository's unload does
        finally:
            done.set()
    run_in_thread(close_all, "engine-close")
    ctrl_c = None
    while True:
        try:
            done.wait()
            break
        except KeyboardInterrupt as e:  # (again and again: each hurries them, the first is raised)
            ctrl_c = ctrl_c or e
            for pool in pools:
                pool.hurry(time.monotonic())
    if ctrl_c is not None:
        raise ctrl_c
    if errors:
        raise errors[0]

