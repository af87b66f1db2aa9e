"""How the compile's child (compile_child.py) ends on a stop signal (SIGTERM, SIGHUP): by the
unwinding a Ctrl-C of `aclserve compile` gets (the ATC it runs killed, its partial files removed),
raised in aclserve's own code; by its own hand, GRACE_S on, if that has not ended it.

Its handler raised KeyboardInterrupt wherever the main thread was. Python drops one raised inside
a finalizer or a C library's callback ("Exception ignored in _get_module_lock ...
KeyboardInterrupt": importlib's weakref callback, about 1 stop in 60), and the child compiled on
until the server's SIGKILL 5 s later; one raised in Python code that onnx's C++ called aborted it
("terminate called after throwing an instance of 'nanobind::python_error'"). Now:

- KeyboardInterrupt is raised only in aclserve's code, whose unwinding was written for it: at once
  when the signal finds the main thread there, else at the next line run by an aclserve frame it
  was called from (those frames traced: f_trace, sys.settrace). It is raised once: from then on
  the stop signals are ignored, none raised inside the unwinding. One that Python drops anyway
  (aclserve code run by a finalizer) is not reported, and is raised so again;
- a thread woken by the signal itself (signal.set_wakeup_fd), so also while the main thread is in
  C code that let go of Python's lock, where no handler runs (ONNX Runtime's runs of the model),
  ends the process GRACE_S after the signal, or after the main thread first heard it if that was
  later (C code that held the lock, loading an ONNX model say, delays the handler and the thread
  alike): the ATC builds in progress ended (ATC killed, its work folder removed:
  atc.end_builds), then os._exit(128 + the signal's number), nothing said. A CPU compile's work
  folder is then left to the next compile's sweep, as one killed outright leaves it
  (work_folder.py).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Iterable

GRACE_S = 1.0  # for the unwinding, before the process ends by its own hand
# aclserve's folder as its code objects name it (co_filename: the path it was imported by)
_OWN_CODE = os.path.dirname(os.path.dirname(__file__)) + os.sep


class StopSignals:
    """The child's stop signals, handled as above once `install`ed (in the main thread, once);
    `signum` is the first one heard (None before)."""

    def __init__(self, signals: Iterable[int]):
        self.signals = frozenset(int(sig) for sig in signals)
        self.signum: int | None = None
        self._raised = False  # a KeyboardInterrupt raised for it (and not dropped)
        self._answered_at: float | None = None  # when the main thread first ran the handler
        self._report_unraisable = sys.unraisablehook

    def install(self) -> None:
        wakeup, woken = os.pipe()
        os.set_blocking(woken, False)  # (set_wakeup_fd's condition: a full pipe never blocks a handler)
        signal.set_wakeup_fd(woken, warn_on_full_buffer=False)
        for sig in self.signals:
            signal.signal(sig, self._heard)
        sys.unraisablehook = self._unraisable
        threading.Thread(target=self._end_after_grace, args=(wakeup,), name="aclserve-compile-stop",
                         daemon=True).start()

    def _heard(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum, self._answered_at = signum, time.monotonic()
        if self._raised:
            return  # (a second signal while it unwinds)
        if not _own_code(frame):  # (a library's code, maybe called from C++ or by a finalizer)
            self._raise_at_next_own_line(frame)
            return
        self._raise()

    def _raise_at_next_own_line(self, frame: FrameType | None) -> None:
        """KeyboardInterrupt at the next line `frame` or a frame it was called from runs, of those
        that are aclserve's (the main thread's frames)."""
        while frame is not None:
            if _own_code(frame):
                frame.f_trace = self._next_own_line
            frame = frame.f_back
        sys.settrace(_no_new_frames)  # (line events on: for those frames only)

    def _next_own_line(self, _frame: FrameType, event: str, _arg) -> object:
        if event == "line" and not self._raised:
            self._raise()
        return self._next_own_line

    def _raise(self) -> None:
        sys.settrace(None)  # (the frames traced, if any, are done with)
        self._raised = True
        # ignored from now on (not merely unraised): a late one met the default action the interpreter's
        # exit restores, and the process ended by that signal, not with 128 + the first one's number
        for sig in self.signals:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    def _unraisable(self, unraisable) -> None:
        if unraisable.exc_type is KeyboardInterrupt and self._raised \
                and threading.current_thread() is threading.main_thread():
            self._raised = False  # ours, dropped where aclserve code ran in a finalizer: raised again
            self._raise_at_next_own_line(sys._getframe(1))  # (the frames the finalizer interrupted)
            return
        self._report_unraisable(unraisable)

    def _end_after_grace(self, wakeup: int) -> None:
        heard = 0
        while heard not in self.signals:
            heard = os.read(wakeup, 1)[0]  # (each byte a signal's number: SIGINT's too)
        time.sleep(GRACE_S)
        while self._answered_at is not None and (late := self._answered_at + GRACE_S - time.monotonic()) > 0:
            time.sleep(late)  # (heard late, out of C code that held Python's lock: its unwinding gets the grace)
        atc = sys.modules.get(f"{__package__}.atc")
        if atc is not None:  # (not imported: no ATC started)
            atc.end_builds()
        os._exit(128 + (self.signum or heard))


def _own_code(frame: FrameType | None) -> bool:
    """Whether `frame` runs aclserve's code: not a library's (onnx's C++ may have called it), not
    a finalizer or weakref callback of the interpreter's, nor this module's (the hooks above)."""
    if frame is None:
        return False
    name = frame.f_code.co_filename
    return name.startswith(_OWN_CODE) and name != __file__


def _no_new_frames(_frame: FrameType, _event: str, _arg) -> None:
    return None  # (the frames called from now on are not traced)
