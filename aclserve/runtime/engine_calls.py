"""The calls of the Python API: one call's runs and its future (Call), and the calls of one
model not answered yet (OpenCalls), which a close stops taking and then waits for."""
from __future__ import annotations

import concurrent.futures
import threading
import time

import numpy as np

from .batch import Batch
from .futures import settle


class Call:
    """One submit(): its batches (one per chunk of the largest gear) and the future they resolve
    exactly once: with the first error, or with the outputs concatenated when all have run."""

    def __init__(self, parts: int, output_names: list[str]):
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self._names = output_names
        self._parts: list[dict[str, np.ndarray] | None] = [None] * parts
        self._left = parts
        self._lock = threading.Lock()  # parts finish on several instances' threads

    def part_done(self, index: int, batch: Batch) -> None:
        with self._lock:
            if self._left == 0:
                return  # already resolved (an earlier part failed)
            error = batch.error
            if error is not None:
                self._left = 0
            else:
                self._parts[index] = batch.outputs[0]
                self._left -= 1
                if self._left:
                    return
        if error is not None or len(self._parts) == 1:
            settle(self.future, error, self._parts[0])
        else:
            settle(self.future, None, {name: np.concatenate([p[name] for p in self._parts]) for name in self._names})


class OpenCalls:
    """The calls of one model whose future is not done yet. Once stop() has run no call is
    taken (`refusal` says why); left() waits for those taken before, as
    ThreadPoolExecutor.shutdown(wait=True) does for its work and the server's shutdown for the
    requests it accepted."""

    def __init__(self):
        self._state = threading.Condition()
        self._open: set[concurrent.futures.Future] = set()
        self.refusal: str | None = None

    def take(self, future: concurrent.futures.Future) -> bool:
        """Hold `future` until it is done; False (not held) once stopped."""
        with self._state:
            if self.refusal is not None:
                return False
            self._open.add(future)
        future.add_done_callback(self._ended)  # (first among its callbacks: added before it is returned)
        return True

    def _ended(self, future: concurrent.futures.Future) -> None:
        with self._state:
            self._open.discard(future)
            if not self._open:
                self._state.notify_all()

    def stop(self, refusal: str) -> None:
        """Take no call from now on; the first reason given is kept."""
        with self._state:
            if self.refusal is None:
                self.refusal = refusal

    def left(self, deadline: float | None) -> list[concurrent.futures.Future]:
        """Wait (blocking) until every call taken is done, or until `deadline` (time.monotonic();
        None: no limit); the futures not done then."""
        with self._state:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._state.wait_for(lambda: not self._open, timeout)
            return list(self._open)
