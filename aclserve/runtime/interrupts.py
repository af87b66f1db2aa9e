"""Ctrl-C held back over a few lines of the main thread that an interrupt must not cut in two:
an Engine call taken and its first runs handed to the pool (EngineModel.submit).

A KeyboardInterrupt is raised by SIGINT's Python handler, which runs in the main thread between
any two of its bytecodes: inside pool.submit as well, once the pool had queued a run and before
the call had counted it out; the call then took it for a run that never went and counted it
back, and a close left the device running it (found by reviewer r19). Within `Deferred` the
handler only notes a SIGINT; at its end the handler is put back and called for the one noted, so
the KeyboardInterrupt comes after the section, which then took no interrupt half-way. Other
threads never run the handler: there nothing is held back.
"""
from __future__ import annotations

import _signal  # (signal's own functions: its wrappers make enums, 20 times the cost of a section)
import signal
import threading


class Deferred:
    """`with Deferred():` the body runs with SIGINT's Python handler noting the signal only; one
    noted is handed to that handler as the body ends (the default one raises KeyboardInterrupt
    there). Not on the main thread, or with SIGINT not handled in Python (SIG_DFL, SIG_IGN, or a
    sub-interpreter's main thread), the body runs as it is. Nested ones hand theirs outwards."""

    __slots__ = ("_handler", "_heard")

    def __enter__(self) -> "Deferred":
        self._handler, self._heard = None, None
        if threading.current_thread() is not threading.main_thread():
            return self
        handler = _signal.getsignal(signal.SIGINT)
        if callable(handler):
            self._handler = handler
            try:
                _signal.signal(signal.SIGINT, self._note)
            except ValueError:  # (not the main interpreter's main thread)
                self._handler = None
        return self

    def _note(self, signum: int, frame) -> None:
        if self._heard is None:
            self._heard = (signum, frame)

    def __exit__(self, *exc) -> None:
        handler = self._handler
        if handler is None:
            return
        # the handler back first, what was noted read after: a SIGINT coming as it is put back (signal()
        # runs the pending handlers, _note still among them, before it swaps) is noted, not lost
        _signal.signal(signal.SIGINT, handler)
        if self._heard is not None:
            handler(*self._heard)
