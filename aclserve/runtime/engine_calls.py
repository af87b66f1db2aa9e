"""The calls of the Python API: one call's runs and its future (Call), and the calls of one
model whose runs are not all back yet (OpenCalls), which a close stops taking and then waits for."""
from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Callable

import numpy as np

from .batch import Batch
from .futures import settle


class Call:
    """One submit(): its batches (one per chunk of the largest gear) and the future they resolve
    exactly once: with the first error, or with the outputs concatenated when all have run. The
    runs are followed apart from the future: a failed part answers it while the others still run,
    and a caller may cancel it (asyncio.wait_for around infer_async) while they all do;
    `on_runs_back` hears when the last of them has come back."""

    def __init__(self, parts: int, output_names: list[str]):
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self._names = output_names
        self._parts: list[dict[str, np.ndarray] | None] = [None] * parts
        self._left = parts
        self._back = [False] * parts  # each run come back (or never submitted)
        self._runs_left = parts
        self.on_runs_back: Callable[[Call], None] | None = None
        self._lock = threading.Lock()  # parts finish on several instances' threads

    def part_done(self, index: int, batch: Batch) -> None:
        try:
            self._resolve(index, batch)
        finally:  # (after the future's done-callbacks: a close waits for them too)
            self.run_back(index)

    def run_back(self, index: int) -> None:
        """Run `index` has come back, or will never run (its submit failed). Once each."""
        with self._lock:
            if self._back[index]:
                return
            self._back[index] = True
            self._runs_left -= 1
            last = self._runs_left == 0
        if last and self.on_runs_back is not None:
            self.on_runs_back(self)

    def _resolve(self, index: int, batch: Batch) -> None:
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
    """The calls of one model whose runs are not all back. Once stop() has run no call is taken
    (`refusal` says why); left() waits for those taken before, as
    ThreadPoolExecutor.shutdown(wait=True) does for its work and the server's shutdown for the
    requests it accepted. Their runs, not their futures: a future cancelled, or answered by a
    failed part, leaves runs on the device that a close must not unload the model under (it
    waited for none of them, and abandoned the instance after reset_timeout_ms)."""

    def __init__(self):
        self._state = threading.Condition()
        self._open: set[Call] = set()
        self.refusal: str | None = None

    def take(self, call: Call) -> bool:
        """Hold `call` until its runs are back; False (not held) once stopped. Before its runs
        are submitted."""
        with self._state:
            if self.refusal is not None:
                return False
            self._open.add(call)
        call.on_runs_back = self._ended
        return True

    def _ended(self, call: Call) -> None:
        with self._state:
            self._open.discard(call)
            if not self._open:
                self._state.notify_all()

    def stop(self, refusal: str) -> None:
        """Take no call from now on; the first reason given is kept."""
        with self._state:
            if self.refusal is None:
                self.refusal = refusal

    def left(self, deadline: float | None) -> list[Call]:
        """Wait (blocking; Ctrl-C interrupts it) until every call taken has its runs back, or until
        `deadline` (time.monotonic(); None: no limit); the calls whose runs are not all back then."""
        with self._state:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._state.wait_for(lambda: not self._open, timeout)
            return list(self._open)

    def still_open(self) -> list[Call]:
        """The calls whose runs are not all back, now."""
        with self._state:
            return list(self._open)
