"""The closes of a shutdown that may block on a device, off the event loop and bounded in time.

The image decoders' close (running decodes finished, DVPP's channel, stream and context
destroyed) and then the runtime's (its devices reset, ACL finalized) run in order in a daemon
thread of their own, awaited until the shutdown's end (`answers_by`: ANSWER_GRACE_S after the
drain's deadline), and at least CLOSE_FLOOR_S. Run on the loop, the runtime's close blocked it
and held the exit for up to 2 s past that end when a retry of abandoned instances waited on a
hung device (runtime/teardown.release_recovered, found with ACLSERVE_CPU_LACKS and
ACLSERVE_CPU_FAULTS). One still running then is left to its thread, one WARNING line naming it;
what it did not do (a device not reset, ACL not finalized) the process's exit does, as for an
abandoned instance, and `left_running()` counts it so the exit does not wait for it (cli/serve.py).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Callable

from ..daemon_threads import run_in_thread

log = logging.getLogger(__name__)

# However late the closes start (a drain that used its whole deadline), an idle device's reset and
# ACL's finalize get this long: the CPU runtime's take a few ms. An NPU's reset of several devices
# can take longer; it is then left to the process's exit, which gives the devices back, rather
# than the exit waiting past the bound `shutdown_timeout_s` promises (a trade-off, in README).
CLOSE_FLOOR_S = 0.1

_lock = threading.Lock()
_running = 0  # close threads still running (left to themselves past their deadline, or not yet done)


def left_running() -> int:
    """Close threads still running: a shutdown left them past its end (they may be inside ACL calls)."""
    with _lock:
        return _running


def _count_running(change: int) -> None:
    global _running
    with _lock:
        _running += change


async def close_by(closes: list[tuple[str, Callable[[], None]]], by: float) -> bool:
    """Run `closes` ((what, close) pairs) one after the other in a daemon thread, until one raises;
    wait until `by` (time.monotonic()), at least CLOSE_FLOOR_S from now. True when all ended (an
    error of theirs is raised here); False when one still runs then, left to the thread and named
    in a WARNING line (those after it run once it ends, if the process still runs)."""
    loop = asyncio.get_running_loop()
    ended = loop.create_future()
    current: list[str] = []  # the close running now (the thread's)

    def finish(error: BaseException | None) -> None:
        if ended.done():
            return
        if error is not None:
            ended.set_exception(error)
        else:
            ended.set_result(None)

    def run() -> None:
        error = None
        try:
            for what, close in closes:
                current[:] = [what]
                close()
            current.clear()
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting side, raised there
            error = e
        finally:
            _count_running(-1)
        try:
            loop.call_soon_threadsafe(finish, error)
        except RuntimeError:  # the loop closed meanwhile: nobody waits any more
            pass
    _count_running(+1)
    run_in_thread(run, "aclserve-device-closes")  # (no thread to be had: closed here, on the loop, as before)
    done, _ = await asyncio.wait([ended], timeout=max(by - time.monotonic(), CLOSE_FLOOR_S))
    if done:
        ended.result()
        return True
    ended.add_done_callback(_read_late_error)
    log.warning("shutdown: %s did not end by the shutdown's deadline; it is left to its thread (what it has "
                "not done, a device reset or ACL's finalize, the process's exit does)",
                current[0] if current else "the device closes")
    return False


def _read_late_error(ended: asyncio.Future) -> None:
    """A close left to its thread that then raised: logged, not an "exception never retrieved"."""
    if not ended.cancelled() and ended.exception() is not None:
        log.error("shutdown: a close left to its thread failed", exc_info=ended.exception())
