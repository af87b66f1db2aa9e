"""A model loaded by the Python API's Engine (engine.py): its calls (submit, infer, infer_async),
each split into runs of the compiled gears, and its close, which waits for the calls made before it.
"""
from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import logging
import threading
import time
from typing import Mapping

import numpy as np

from ..errors import Closed
from ..value_ranges import ValueRange
from . import interrupts
from .batch import Batch
from .closing import close_pools
from .engine_calls import Call, OpenCalls
from .engine_inputs import checked_inputs
from .engine_options import check_options
from .engine_process import CreatedIn
from .futures import settle
from .pool import InstancePool
from .types import TensorSpec

log = logging.getLogger("aclserve.runtime.engine")  # one logger for the Python API's lines

ENGINE_CLOSED = "the engine is closed: make a new Engine"


class EngineModel:
    """A loaded model. Owned by its Engine; close() unloads it (blocking) once the calls made
    before it are answered. The pool's listener: each finished batch goes back to the call it is
    part of. `value_ranges`: {integer input name: ValueRange} its calls are checked against
    (Engine.load's value_ranges)."""

    def __init__(self, pool: InstancePool, owner=None, value_ranges: Mapping[str, ValueRange] | None = None):
        self.pool = pool
        self.owner = owner  # the Engine (its close() refuses to run in a done-callback of its calls)
        self.name = pool.name
        self.inputs: list[TensorSpec] = pool.inputs
        self.outputs: list[TensorSpec] = pool.outputs
        self.gears = pool.gears
        self.value_ranges: dict[str, ValueRange] = dict(value_ranges or {})
        self._calls = OpenCalls()  # those not answered yet: a close waits for them
        # a call's runs handed to the pool at a time: as many as can be on the device (Call)
        self._in_flight = sum(len(instance.slots) for instance in pool.instances)
        self._created_in = owner.created_in if owner is not None else CreatedIn()
        pool.attach(self)

    @property
    def closed(self) -> bool:
        """close() has begun, the model's or its Engine's: calls are refused (Closed)."""
        return self._calls.refusal is not None or (self.owner is not None and self.owner.closed)

    def submit(self, inputs: Mapping[str, np.ndarray]) -> concurrent.futures.Future:
        """Start inference; the future resolves to {output name: array}. It checks and copies the
        inputs first (a caller may reuse its arrays once it returns), raising ValueError or
        TypeError for a wrong one, then returns without waiting for the device. Once the model or
        its Engine is closing the future fails with Closed (a future, not a raise: a
        done-callback chaining calls gets its answer). In a forked child: RuntimeError, at once.
        A call of more rows than the largest gear runs in several runs, handed to the device as
        many at a time as the model's instances have slots: cancelling the future drops those not
        launched yet, and those launched finish unheard (a close waits for them)."""
        self._created_in.check()  # (before any lock: a fork may have copied one held)
        if self.closed:
            return _failed(Closed(self._refusal()))
        arrays = checked_inputs(inputs, self.inputs, self.value_ranges)
        if not self.gears:
            chunks = [(arrays, None, 1)]
        else:
            largest = self.gears[-1]
            rows = len(next(iter(arrays.values())))
            chunks = []
            for start in range(0, rows, largest):
                chunk = {k: v[start:start + largest] for k, v in arrays.items()}
                n = len(next(iter(chunk.values())))
                chunks.append((chunk, self.gears[bisect.bisect_left(self.gears, n)], n))
        call = Call(chunks, [s.name for s in self.outputs], self.pool.submit, self._in_flight)
        try:
            with interrupts.Deferred():  # (taken and started as one: a Ctrl-C between left the call
                taken = self._calls.take(call)  # open for good, or counted a run queued as never gone)
                if taken:
                    call.start()
        except BaseException as e:  # Ctrl-C, come once its runs were handed on, or the pool refusing one
            call.give_up(e)  # (nobody has its future: the runs not handed on would run unheard)
            raise
        if not taken:  # (a close began since the check above)
            return _failed(Closed(self._refusal()))
        return call.future

    def infer(self, inputs: Mapping[str, np.ndarray], timeout: float | None = None) -> dict[str, np.ndarray]:
        """Run `inputs` ({input name: array}) and return {output name: array} (blocking): submit()
        and its result. `timeout`: at most that many seconds (None: until answered, every run
        bounded by the model's execution timeout); past it TimeoutError
        (concurrent.futures.TimeoutError before Python 3.11). Past it, or on Ctrl-C while it waits,
        the call is given up as by cancelling its future (submit()): its runs not launched yet
        are dropped."""
        refuse_in_callback(self.owner, "EngineModel.infer()", "it waits for its call, which this thread may have "
                                        "to finish: use submit() here")
        check_options(timeout=timeout)
        future = self.submit(inputs)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError as e:  # (TimeoutError from Python 3.11): said, not blank
            if future.done() and not future.cancelled() and future.exception() is e:
                raise  # (the call's own)
            future.cancel()  # (nobody can take its answer now)
            raise concurrent.futures.TimeoutError(f"model {self.name}: the call was not answered within {timeout} s; "
                                                  "it is given up: its runs not launched yet are dropped") from None
        except BaseException:  # Ctrl-C: given up as well
            future.cancel()
            raise

    async def infer_async(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """infer() for asyncio code: awaits submit()'s future (no timeout of its own: wrap it in
        asyncio.wait_for; cancelling it cancels the future: its runs not launched yet are dropped,
        those launched finish unheard, and a close waits for them)."""
        return await asyncio.wrap_future(self.submit(inputs))

    # -- BatchListener (the pool's threads) ----------------------------------------------------
    def batch_done(self, batch: Batch) -> None:
        """(The pool's listener, not for callers) A run of a call has ended, on a pool thread."""
        call, index = batch.requests
        outer, _callbacks.engine = getattr(_callbacks, "engine", None), self.owner  # the future's
        try:  # done-callbacks run from here (Engine.close); `outer`: a callback's own call answered at once
            call.part_done(index, batch)
        except BaseException:  # a callback's SystemExit or KeyboardInterrupt, which concurrent.futures
            log.exception("%s: a done-callback failed", self.name)  # lets through: it stopped this thread
        finally:
            _callbacks.engine = outer

    def slot_free(self) -> None:
        """(The pool's listener) Nothing waits here: a call hands its next run on as one comes back (Call)."""

    def close(self, timeout: float | None = None) -> None:
        """Refuse calls from now on (Closed), let those made before finish (and the runs launched by
        those given up), then unload the model (blocking); with its Engine's closes, one at a time.
        `timeout`: at most that many seconds for them (None: until each is answered, every run
        bounded by the model's execution timeout); the calls still unanswered then fail with Closed,
        and a device still running one is left to itself, as the server's shutdown_timeout_s does."""
        self._created_in.check()
        refuse_in_callback(self.owner, "EngineModel.close()", "it waits for the engine's own threads, this one "
                                        "among them")
        check_options(timeout=timeout)
        if self.owner is None:
            self._close(deadline_after(timeout), f"model {self.name} is closed")
        else:
            self.owner._close_model(self, deadline_after(timeout))

    def _refusal(self) -> str:
        return self._calls.refusal or ENGINE_CLOSED  # (the engine closing, its models not stopped yet)

    def _close(self, deadline: float | None, refusal: str) -> None:
        self._calls.stop(refusal)
        interrupted = False
        try:
            self._drain(deadline)
        except BaseException:  # Ctrl-C in the wait: the calls left fail now, the device is not waited for
            interrupted = True
            self._fail(self._calls.still_open(), "the close was interrupted")
            raise
        finally:  # (the model is closed all the same)
            close_pools([self.pool], deadline, interrupted)

    def _drain(self, deadline: float | None) -> None:
        """Wait until `deadline` for the runs of the calls taken, those a cancelled call launched
        too; fail the calls left then with Closed, before the pool's close waits for the device
        (their runs: answered by it, or abandoned, unheard)."""
        self._fail(self._calls.left(deadline), "the close's timeout passed")

    def _fail(self, calls: list[Call], why: str) -> None:
        outer, _callbacks.engine = getattr(_callbacks, "engine", None), self.owner  # (their done-callbacks
        try:  # run here: the engine's closes, which this thread holds, are refused in them)
            for call in calls:
                settle(call.future, Closed(f"model {self.name} was closed before the call was answered ({why})"))
        finally:
            _callbacks.engine = outer


def refuse_in_callback(engine, what: str, why: str) -> None:
    if engine is not None and getattr(_callbacks, "engine", None) is engine:
        raise RuntimeError(f"{what} cannot run in a done-callback of the engine's calls ({why}); "
                           f"call it from another thread")


_callbacks = threading.local()  # .engine: the Engine whose call's future this thread is resolving


def deadline_after(timeout: float | None) -> float | None:
    """A close's deadline on time.monotonic() `timeout` seconds from now (None: no limit)."""
    return None if timeout is None else time.monotonic() + timeout


def _failed(error: BaseException) -> concurrent.futures.Future:
    future = concurrent.futures.Future()
    future.set_exception(error)
    return future
