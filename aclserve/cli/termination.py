"""How a command other than serve ends on SIGTERM or SIGHUP (serve's loop handles them itself):
as at a Ctrl-C, through its own clean-up (a compile's partial .om and work folder removed, the ATC
it started killed; a profile's tracing turned off), with exit status 128 + the signal's number.
Their default action ended the process at once and left all that.

A sync command (compile, inspect, infer) gets KeyboardInterrupt where its main thread is, as from
Ctrl-C. An async one (profile) runs its coroutine through `run`, and the signal cancels its main
task, as asyncio.run does for Ctrl-C. The handler raised SIGINT for both, Ctrl-C's own way, but
where SIGINT is ignored (a background job of a script: `bash -c 'aclserve profile ... &'`)
asyncio.run does not take it over (nor does it before Python 3.11), and the KeyboardInterrupt
raised instead broke into whatever loop callback ran: tracebacks, a run that went on (Python drops
one raised in a weakref callback), or a hang in asyncio.run's cancelling of the tasks left.
"""
from __future__ import annotations

import signal
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class _MainTask:
    """The task `run` runs in the main thread, while it runs, and whether a stop signal cancelled it."""
    task = None
    cancelled = False


def end_on_termination(received: list[int]) -> dict:
    """Handle SIGTERM and SIGHUP as said above, each appended to `received` (the exit status is
    128 + the last one). A signal ignored as the process started (nohup) stays ignored. Main
    thread only; returns the handlers replaced."""
    def end(signum, _frame):
        received.append(signum)
        task = _MainTask.task
        if task is None or task.done():
            raise KeyboardInterrupt
        # (a second signal cancels it again: it cuts a clean-up's wait short, as a second Ctrl-C does)
        _MainTask.cancelled = True
        task.cancel()
        task.get_loop().call_soon_threadsafe(lambda: None)  # (wakes a loop asleep in select() to run it)
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, end) for sig in STOP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN}


def run(coro):
    """asyncio.run(coro); KeyboardInterrupt when a stop signal cancelled its main task."""
    import asyncio

    if threading.current_thread() is not threading.main_thread():  # (the handlers are the main thread's)
        return asyncio.run(coro)

    async def main():
        _MainTask.task, _MainTask.cancelled = asyncio.current_task(), False
        return await coro
    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        if _MainTask.cancelled:
            raise KeyboardInterrupt from None
        raise
    finally:
        _MainTask.task = None
