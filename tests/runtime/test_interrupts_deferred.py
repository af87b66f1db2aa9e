"""interrupts.Deferred: a SIGINT noted in the section is handed to the handler as it ends, one
coming while the handler is put back too (found by reviewer r20: it was noted after the noted one
had been read, and lost)."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from aclserve.runtime import interrupts

pytestmark = pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                                reason="Deferred acts on the main thread only")


class _SigintAsTheHandlerIsPutBack:
    """interrupts._signal, with a SIGINT sent just before a handler is set: CPython runs the
    pending handlers (the section's own) before it swaps."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def signal(self, signum, handler):
        if not isinstance(getattr(handler, "__self__", None), interrupts.Deferred):  # (the one put back)
            os.kill(os.getpid(), signal.SIGINT)
        return self._real.signal(signum, handler)


def test_a_sigint_in_the_section_comes_through_as_it_ends():
    with pytest.raises(KeyboardInterrupt):
        with interrupts.Deferred():
            os.kill(os.getpid(), signal.SIGINT)
            reached = True  # (the section is not cut short)
    assert reached


def test_a_sigint_coming_as_the_handler_is_put_back_is_not_lost(monkeypatch):
    monkeypatch.setattr(interrupts, "_signal", _SigintAsTheHandlerIsPutBack(interrupts._signal))
    with pytest.raises(KeyboardInterrupt):
        with interrupts.Deferred():
            pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
