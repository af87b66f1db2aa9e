"""Counters of one batcher: what the Prometheus exporter and the statistics extension read
(both in server/, which owns their shapes: server/metrics.py, server/model_stats.py)."""
from __future__ import annotations

import logging
import time
from typing import Callable, Iterable

from ..runtime.types import DeviceTimings

log = logging.getLogger(__name__)

# `reason` values passed to on_request_done ("" when ok)
OK, QUEUE_FULL, TIMEOUT, CANCELLED, FAILED, SHUTDOWN = "", "queue_full", "timeout", "cancelled", "failed", "shutdown"

RequestObserver = Callable[[int, float, bool, str], None]  # (level, queue_s, ok, reason)
BatchObserver = Callable[["int | None", int, float], None]  # (gear, rows, compute_s)


class Duration:
    """How many, and their total nanoseconds (a statistics-extension duration)."""

    __slots__ = ("count", "ns")

    def __init__(self):
        self.count = 0
        self.ns = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns


class LevelStats:
    __slots__ = ("accepted", "rejected", "timed_out", "delayed", "cancelled")

    def __init__(self):
        self.accepted = 0  # entered the queue
        self.rejected = 0  # level full
        self.timed_out = 0  # deadline passed under `reject`
        self.delayed = 0  # deadline passed under `delay`
        self.cancelled = 0  # client went away while queued or running


class BatchSizeStats:
    __slots__ = ("compute_input", "compute_infer", "compute_output")

    def __init__(self):
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()


class BatcherStats:
    """Plain counters written by the batcher on the event loop thread; readers (the metrics
    exporter, the stats endpoint) read them on the same thread, so no locks.

    As Triton's statistics: `success`, `queue` and the compute durations count the requests
    answered with outputs (one each, so their counts agree), when the outcome reaches the
    request's future (a result held for ordering whose client leaves first is not one),
    success running from enqueue to the run's result and queue from enqueue to that run's
    launch on an instance (Triton's compute start: a formed batch waiting for its instance's
    slot or launcher is still queued); `fail` is written by the server for
    every failed request, whatever failed it (a refusal here, a failed run, a client gone, bad
    input: server/infer_pipeline.py counted_infer, where /metrics counts failures too), from its
    arrival. `inference_count` is the rows of the successful requests, `execution_count`
    every run.
    Device timings of a run map to compute_input (h2d), compute_infer, compute_output (d2h);
    a run that reports no device compute time counts its wall time (launch -> result) as
    compute_infer. What is left of success is the run's host work (pack, unpack, the hand-offs
    between threads) and, for a run launched while another computed, its wait on the device
    for that one's execution. Observers registered with `observe()` see every request outcome
    and every executed run (for histograms); an observer that raises is logged and kept.
    """

    def __init__(self, levels: Iterable[int], depth: Callable[[], dict[int, int]] = dict):
        self.levels = {level: LevelStats() for level in levels}
        self._depth = depth
        self.gear_batches: dict[int | None, int] = {}
        self.rows = 0  # real rows executed
        self.padding_rows = 0  # gear rows that were padding
        self.success = Duration()
        self.fail = Duration()  # written by the server (request_failed)
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self.execution_count = 0
        self.inference_count = 0  # rows of successful requests
        self.last_inference_ms = 0
        self.batch_sizes: dict[int, BatchSizeStats] = {}
        self._request_observers: list[RequestObserver] = []
        self._batch_observers: list[BatchObserver] = []

    def observe(self, on_request_done: RequestObserver | None = None,
                on_batch: BatchObserver | None = None) -> None:
        if on_request_done is not None:
            self._request_observers.append(on_request_done)
        if on_batch is not None:
            self._batch_observers.append(on_batch)

    @property
    def has_request_observers(self) -> bool:
        return bool(self._request_observers)

    # -- recording (batcher only) ---------------------------------------------------------

    def request_done(self, level: int, queue_s: float, ok: bool, reason: str) -> None:
        for observer in self._request_observers:
            try:
                observer(level, queue_s, ok, reason)
            except Exception:
                log.exception("statistics observer on_request_done failed")

    def request_failed(self, ns: int) -> None:
        """One failed request, `ns` from its arrival (the server's call: see the class)."""
        self.fail.add(ns)

    def rejected(self, level: int, reason: str, waited_ns: int = 0) -> None:
        """A request that never ran: queue full, timed out, shut down while queued."""
        stats = self.levels[level]
        if reason == QUEUE_FULL:
            stats.rejected += 1
        elif reason == TIMEOUT:
            stats.timed_out += 1
        self.request_done(level, waited_ns / 1e9, False, reason)

    def cancelled(self, level: int, waited_ns: int) -> None:
        self.levels[level].cancelled += 1
        self.request_done(level, waited_ns / 1e9, False, CANCELLED)

    def batch_executed(self, gear: int | None, rows: int, compute_ns: int,
                       timings: DeviceTimings) -> tuple[int, int, int]:
        """One successful run; `compute_ns` is its launch-to-result wall time (a part of a batch
        re-run one request per run: its own: runtime/isolation.py). Returns the
        (h2d, infer, d2h) ns that each of its requests spent in it (request_answered)."""
        self.gear_batches[gear] = self.gear_batches.get(gear, 0) + 1
        self.rows += rows
        if gear is not None:
            self.padding_rows += gear - rows
        self.execution_count += 1
        self.last_inference_ms = int(time.time() * 1000)
        h2d = int(timings.h2d_ms * 1e6)
        infer = int(timings.compute_ms * 1e6) or compute_ns
        d2h = int(timings.d2h_ms * 1e6)
        size = self.batch_sizes.get(rows)
        if size is None:
            size = self.batch_sizes[rows] = BatchSizeStats()
        size.compute_input.add(h2d)
        size.compute_infer.add(infer)
        size.compute_output.add(d2h)
        for observer in self._batch_observers:
            try:
                observer(gear, rows, compute_ns / 1e9)
            except Exception:
                log.exception("statistics observer on_batch failed")
        return h2d, infer, d2h

    def request_answered(self, rows: int, queue_ns: int, success_ns: int, h2d: int, infer: int, d2h: int) -> None:
        """A request's outputs reached it: per request, as Triton does, every request of a run
        spent the run's time."""
        self.success.add(success_ns)
        self.queue.add(queue_ns)
        self.compute_input.add(h2d)
        self.compute_infer.add(infer)
        self.compute_output.add(d2h)
        self.inference_count += rows

    # -- reading ---------------------------------------------------------------------------

    def queue_depth(self) -> dict[int, int]:
        return self._depth()

    def padding_ratio(self) -> float:
        """Padding rows / all executed gear rows (0 when nothing ran)."""
        total = self.rows + self.padding_rows
        return self.padding_rows / total if total else 0.0
