"""The stop signals `aclserve serve` receives while it starts, before its event loop handles them.

From the process's first lines (`python -m aclserve serve`: __main__.py; the `aclserve` script:
cli.main) until serve's loop sets its own handlers (server/app.py `serve`), SIGTERM, SIGINT and
SIGHUP (not one ignored as the process started: nohup) are only recorded here. Their default
actions killed the process (143, nothing logged) or raised KeyboardInterrupt wherever it was
(130, at times a traceback) for the 1-2 s that the imports, the config and the building of the
servers take, while a pod being deleted as it starts expects the stop of any other time. The
start-up looks at what was recorded at its steps (`asked`, `take`) and stops there as a stop
at any other time does: a line, then exit status 0. A second one before then ends the process
as its default action would, at once: a start-up that waits for good (a config pipe nobody
writes to) still ends.

Main thread only (signal handlers are set there). The handler neither logs nor raises: it runs
between any two bytecodes of the main thread, inside the log queue's lock or a module's import.
"""
from __future__ import annotations

import logging
import signal
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

_received: list[signal.Signals] = []
_replaced: dict = {}  # {signal: the handler recording replaced}, while recording


def record() -> None:
    """Record the stop signals from now on, until `take` or `release` (a no-op while recording,
    or outside the main thread)."""
    if _replaced or threading.current_thread() is not threading.main_thread():
        return
    for sig in STOP_SIGNALS:
        if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
            continue  # (nohup: it stays ignored, which serve's loop then says when one comes)
        _replaced[sig] = signal.signal(sig, _recorded)


def _recorded(signum: int, _frame) -> None:
    _received.append(signal.Signals(signum))
    if len(_received) > 1:  # asked again: ended now, as the signal's default action ends it
        release()
        signal.raise_signal(signum)


def asked() -> signal.Signals | None:
    """The first stop signal recorded, if any."""
    return _received[0] if _received else None


def take() -> signal.Signals | None:
    """The caller handles the stop signals from now on (its handlers have replaced this module's):
    the first one recorded before, if any. Recording ends."""
    first = asked()
    _replaced.clear()
    _received.clear()
    return first


def release() -> None:
    """Put back the handlers that recording replaced, unless `take` ended it (a start-up that
    ended otherwise, before its loop took the signals: a usage error; main() called in-process)."""
    for sig, handler in _replaced.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    _replaced.clear()
    _received.clear()


def say_stopped(sig: signal.Signals) -> None:
    """The line of a stop asked while the server was starting (not from the signal's handler)."""
    logging.getLogger(__name__).info("%s received during start-up: shutting down", sig.name)
