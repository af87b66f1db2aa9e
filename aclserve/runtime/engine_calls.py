"""The calls of the Python API: one call's runs and its future (Call), and the calls of one
model whose runs are not all back yet (OpenCalls), which a close stops taking and then waits for."""
from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Callable, Iterable

import numpy as np

from .batch import Batch
from .futures import settle


class Call:
    """One submit(): its chunks (one run each, of at most the largest gear) and the future they
    resolve exactly once: with the first error, or with the outputs concatenated when all have run.
    At most `in_flight` runs are handed to `run` (the pool) at a time, the next as one comes back,
    and none once the future is done: a call given up (cancelled, past infer()'s timeout, Ctrl-C)
    or failed drops its runs not handed on yet (they all went to the pool at once, and ran unheard
    before the next call: tester t46's call of 100 runs, cancelled at its first, held the model for
    all 100). The runs are followed apart from the future: those handed on come back whether it is
    answered or cancelled; `on_runs_back` hears when the last has come back (or been dropped)."""

    def __init__(self, chunks: list[tuple[dict[str, np.ndarray], int | None, int]], output_names: list[str],
                 run: Callable[[Batch], None], in_flight: int):
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self._names = output_names
        self._chunks = chunks  # (inputs, gear, rows) of each run
        self._run, self._in_flight = run, max(1, in_flight)
        self._handed = 0  # the runs handed to `run` (or dropped) so far, in order
        self._parts: list[dict[str, np.ndarray] | None] = [None] * len(chunks)
        self._left = len(chunks)
        self._back = [False] * len(chunks)  # each run come back (or dropped)
        self._runs_left = len(chunks)
        self.on_runs_back: Callable[[Call], None] | None = None
        self._lock = threading.Lock()  # parts finish on several instances' threads

    def start(self) -> None:
        """Hand the first runs on (the caller's thread): as many as may be in flight, and no more
        than the call has. A raise of `run` answers the future with it and drops the runs not
        handed on, then goes on up. Ctrl-C is the caller's to hold back meanwhile (EngineModel.submit):
        one coming through `run` once the pool had queued the run would count it as never gone."""
        for _ in range(min(self._in_flight, len(self._chunks))):  # (each turn takes the lock: a one-run
            self._hand_on(caller=True)  # call on 16 slots took it 16 times, 2-3 times the cost of a call on one)

    def part_done(self, index: int, batch: Batch) -> None:
        try:
            try:
                self._resolve(index, batch)
            finally:  # (after the answer: a failed part drops the runs left; even when a done-callback
                self._hand_on()  # let SystemExit through it, as concurrent.futures does: the call stayed open)
        finally:  # (after the future's done-callbacks: a close waits for them too)
            self.run_back(index)

    def give_up(self, error: BaseException) -> None:
        """Answer the future with `error` (unless answered) and drop the runs not handed on; those
        out come back as they end."""
        try:
            settle(self.future, error)
        finally:  # (a done-callback may let SystemExit through: part_done)
            self._hand_on()

    def _hand_on(self, caller: bool = False) -> None:
        """Hand the next run to `run`, or, once the future is done, drop every run left. A raise
        of `run` answers the future with it and drops the runs left; it goes on up from the
        `caller`'s thread only (start): on a completion thread the future carries it, and the
        pool's listener took it for a done-callback's."""
        with self._lock:
            index, end = self._handed, len(self._chunks)
            dropped = self.future.done()
            self._handed = end if dropped else min(index + 1, end)
        if index == end:
            return
        if dropped:
            self._drop(range(index, end))
            return
        inputs, gear, rows = self._chunks[index]
        try:
            self._run(Batch([inputs], gear, rows, requests=(self, index)))
        except BaseException as e:  # the pool did not queue it (Ctrl-C after it had is held back: start)
            try:
                self.give_up(e)  # (a call left open would hold a close without a timeout for good)
            finally:
                self.run_back(index)
            if caller:
                raise

    def _drop(self, indices: Iterable[int]) -> None:
        for index in indices:
            self.run_back(index)

    def run_back(self, index: int) -> None:
        """Run `index` has come back, or will never run (dropped). Once each."""
        with self._lock:
            if self._back[index]:
                return
            self._back[index] = True
            self._runs_left -= 1
            last = self._runs_left == 0
        if last and self.on_runs_back is not None:
            self.on_runs_back(self)

    def runs_out(self) -> int:
        """The runs handed on that have not come back."""
        with self._lock:
            return self._handed - sum(self._back[:self._handed])

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

    def awaited(self) -> tuple[int, int]:
        """What a close waits for now: the calls not answered yet, and the runs still out of those
        answered or given up (a cancelled call's launched or queued in the pool)."""
        calls = self.still_open()
        return sum(not call.future.done() for call in calls), sum(call.runs_out() for call in calls
                                                                   if call.future.done())
