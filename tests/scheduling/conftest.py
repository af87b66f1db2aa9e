"""Test doubles for the scheduler: a manual clock and a gated BatchExecutor.

The executor is not the ACL layer: it stands in for runtime.InstancePool at the batcher's
BatchExecutor boundary. It really pads, computes and splits, so a test can check that every
request got back exactly its own rows (y = 2 * x, and x carries a per-row tag).
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import threading

import numpy as np
import pytest
import pytest_asyncio

from aclserve.runtime.batch import Batch
from aclserve.runtime.types import DeviceTimings
from aclserve.scheduling import BatchingConfig, DynamicBatcher


class ManualClock:
    """Time moves only when the test calls advance(); due timers fire in order, at once."""

    def __init__(self, start: float = 100.0):
        self._now = start
        self._timers: list = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def now_ns(self) -> int:  # the duration clock follows the same manual time
        return round(self._now * 1e9)

    def call_at(self, when, callback, *args):
        handle = _Handle(callback, args)
        heapq.heappush(self._timers, (when, next(self._seq), handle))
        return handle

    def advance(self, seconds: float) -> None:
        target = self._now + seconds
        while self._timers and self._timers[0][0] <= target:
            when, _, handle = heapq.heappop(self._timers)
            self._now = max(self._now, when)
            handle.fire()
        self._now = target

    @property
    def pending_timers(self) -> int:
        return sum(1 for _, _, handle in self._timers if not handle.cancelled)


class _Handle:
    def __init__(self, callback, args):
        self.callback, self.args, self.cancelled = callback, args, False

    def cancel(self):
        self.cancelled = True

    def fire(self):
        if not self.cancelled:
            self.callback(*self.args)


def make_rows(tag: int, rows: int) -> dict[str, np.ndarray]:
    """Inputs of one request: x[i] = (tag, i), so every row names its request and position."""
    x = np.stack([np.full(rows, tag, np.float32), np.arange(rows, dtype=np.float32)], axis=1)
    return {"x": x}


def expected(tag: int, rows: int) -> np.ndarray:
    return make_rows(tag, rows)["x"] * 2


class FakeRun:
    """One submitted batch as the fake executor runs it."""

    def __init__(self, executor, batch: Batch, lane=0):
        self.executor, self.batch, self.lane = executor, batch, lane
        self.requests, self.gear = list(batch.inputs), batch.gear
        self.rows = sum(len(r["x"]) for r in self.requests)
        self.done = False

    @property
    def tags(self) -> list[int]:
        return [int(r["x"][0, 0]) for r in self.requests]

    def compute(self, compute_ms: float = 0.5) -> None:
        """Write the outcome into the batch, as an instance does."""
        x = np.concatenate([r["x"] for r in self.requests])
        size = self.gear if self.gear is not None else len(x)
        padded = np.zeros((size, 2), np.float32)
        padded[:len(x)] = x
        y = padded * 2  # the whole gear runs, padding included
        outputs, start = [], 0
        for request in self.requests:
            rows = len(request["x"])
            outputs.append({"y": y[start:start + rows]})
            start += rows
        batch = self.batch
        batch.outputs, batch.timings, batch.instance = outputs, DeviceTimings(0.1, compute_ms, 0.2), "fake_0"

    def complete(self, compute_ms: float = 0.5) -> None:
        """Finish the run; `compute_ms` is the device compute time it reports."""
        self.compute(compute_ms)
        self._finish()

    def fail(self, error: BaseException) -> None:
        self.batch.error = error
        self._finish()

    def _finish(self) -> None:
        """As an instance does: the outcome first, then the slot."""
        assert not self.done, "a batch finished twice"
        self.done = True
        self.executor.listener.batch_done(self.batch)
        self.executor._release(self.lane)


class FakeExecutor:
    """A BatchExecutor of `instances` instances ("lanes") with `slots` slots each. Runs wait
    until the test calls complete()/fail(), unless `auto` is set: then a worker thread per run
    completes it (real cross-thread hops)."""

    def __init__(self, gears=(1, 2, 4, 8), slots=1, gear_cost=None, auto=False, compute_cost=None,
                 instances=1):
        self.gears = tuple(gears)
        self.gear_cost = dict(gear_cost or {})
        self.compute_cost = dict(compute_cost or {})
        self.slots = slots
        self.auto = auto
        self.runs: list[FakeRun] = []
        self.busy = [0] * instances
        self.listener = None
        self.out_of_service_reason: str | None = None
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def lanes(self) -> list[int]:
        with self._lock:
            return [self.slots - busy for busy in self.busy]

    def out_of_service(self) -> str | None:
        return self.out_of_service_reason

    def failed_for_good(self) -> Exception | None:
        return None

    def attach(self, listener) -> None:
        self.listener = listener

    def submit(self, batch: Batch) -> None:
        requests, gear, lane = batch.inputs, batch.gear, batch.lane
        assert requests, "empty run"
        if self.gears:
            assert gear in self.gears, f"gear {gear} not compiled"
        else:
            assert gear is None and len(requests) == 1
        with self._lock:
            if lane is None:
                lane = min(range(len(self.busy)), key=self.busy.__getitem__)
            assert 0 <= lane < len(self.busy), f"lane {lane} of {len(self.busy)} instances"
            assert self.busy[lane] < self.slots, f"lane {lane} has no free slot"
            self.busy[lane] += 1
        run = FakeRun(self, batch, lane)
        assert gear is None or run.rows <= gear, f"{run.rows} rows do not fit gear {gear}"
        assert run.rows == batch.rows, f"batch says {batch.rows} rows, its requests hold {run.rows}"
        self.runs.append(run)
        if self.auto:
            thread = threading.Thread(target=run.complete)
            self._threads.append(thread)
            thread.start()

    def _release(self, lane: int) -> None:
        with self._lock:
            self.busy[lane] -= 1
        self.listener.slot_free()

    def join(self) -> None:
        for thread in self._threads:
            thread.join()

    @property
    def pending(self) -> list[FakeRun]:
        return [run for run in self.runs if not run.done]


async def settle(rounds: int = 20) -> None:
    """Let the event loop run every callback chain that is ready (no time passes)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(scope="session")
def fakes():
    """The helpers above, for test modules (conftest is not importable by name)."""
    import types
    return types.SimpleNamespace(FakeExecutor=FakeExecutor, ManualClock=ManualClock,
                                 make_rows=make_rows, expected=expected, settle=settle)


class BatcherEnv:
    """Builds batchers on fake executors for one test and closes them afterwards."""

    FakeExecutor = FakeExecutor
    make_rows = staticmethod(make_rows)
    expected = staticmethod(expected)
    settle = staticmethod(settle)

    def __init__(self, clock):
        self.clock = clock
        self.batchers: list[DynamicBatcher] = []

    def make(self, executor=None, **config):
        executor = executor or FakeExecutor()
        batcher = DynamicBatcher(executor, BatchingConfig(**config), name="m:1", clock=self.clock)
        self.batchers.append(batcher)
        return batcher, executor

    def submit(self, batcher, tag, rows=1, **kw) -> asyncio.Task:
        return asyncio.ensure_future(batcher.infer(make_rows(tag, rows), rows, **kw))

    async def close(self):
        for batcher in self.batchers:
            await batcher.close()


@pytest_asyncio.fixture
async def env(clock):
    env = BatcherEnv(clock)
    yield env
    await env.close()
