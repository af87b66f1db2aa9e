"""A batch: what the scheduler hands the executor, and what comes back on the same object.

The submitter fills the request side (`inputs`, `gear`, `rows`, `lane`, `trace`, and its own
`requests` and `dispatched_ns`, which the runtime never reads); the instance that runs it stamps
its launch (`launched_ns`) and fills the outcome (`outputs`, `timings`, `instance`) or `error`,
then signals `batch_done(batch)` to its listener. One object from formation to answer: no
futures, no copies of the request list. A failed batch re-run one request per run (isolation.py)
comes back with `runs` as well: the runs that answered its requests, each with its own launch and
timed by the runtime's own clock (time.perf_counter_ns, as `launched_ns`).
"""
from __future__ import annotations

from typing import Mapping, NamedTuple, Protocol, Sequence

import numpy as np

from .types import DeviceTimings


class Run(NamedTuple):
    """One successful run of a part of a batch re-run one request per run (isolation.py)."""

    index: int  # the request it answered: its place in the whole batch's `inputs`
    gear: int | None
    rows: int
    timings: DeviceTimings
    wall_ns: int  # its launch on an instance to its result (time.perf_counter_ns)
    instance: str
    launched_ns: int  # time.perf_counter_ns at its launch (as Batch.launched_ns)


class Batch:
    """One run of the model: the rows of one or more requests, padded to `gear`."""

    __slots__ = ("inputs", "gear", "rows", "lane", "trace", "requests", "dispatched_ns", "launched_ns",
                 "ran_on", "ran_by", "outputs", "timings", "instance", "error", "errors", "beside", "failed_lane",
                 "failed_by", "runs")

    def __init__(self, inputs: Sequence[Mapping[str, np.ndarray]], gear: int | None, rows: int,
                 lane: int | None = None, trace=None, requests: Sequence = (), dispatched_ns: int = 0):
        self.inputs = inputs  # per request: input name -> its rows (first dimension)
        self.gear = gear  # compiled batch size to run; None for a static model
        self.rows = rows  # real rows (sum over requests); gear - rows are padding
        self.lane = lane  # instance index the submitter asked for (None: any); never changed
        self.trace = trace  # a trace.BatchTrace when the batch carries a sampled request
        self.requests = requests  # the submitter's own records, in `inputs` order (opaque here)
        self.dispatched_ns = dispatched_ns  # the submitter's clock (opaque here)
        self.ran_on: int | None = None  # instance index it was launched on (by the pool)
        # time.perf_counter_ns when its instance's launcher thread took it to put it on the device
        # (a trace's COMPUTE_START; a retry's: its last launch); 0 until then. Where a request's
        # queue time ends and its compute time starts (scheduling/delivery.py)
        self.launched_ns = 0
        self.ran_by = None  # ... and the ModelInstance there then (a lane's instance is replaced by a rebuild)
        # the outcome, written by the instance before batch_done():
        self.outputs: list[dict[str, np.ndarray]] | None = None  # per request, padding dropped
        self.timings = DeviceTimings()
        self.instance = ""  # name of the instance that ran it
        self.error: BaseException | None = None
        # per request, when a failed batch re-run one request per run (isolation.py) had some of
        # its requests fail and others not: each one's error, None for those answered
        self.errors: list[BaseException | None] | None = None
        # a re-run batch with requests answered: the runs that answered them, each with its own
        # gear, rows and timings (not this batch's, whose run failed); None for a batch run whole
        self.runs: list[Run] | None = None
        self.beside = False  # failed while other batches were in flight on its instance (one may have faulted)
        # set by a retry: the lane and the instance that failed it first (the retry may run on
        # any other instance, that lane's once rebuilt included)
        self.failed_lane: int | None = None
        self.failed_by = None

    def describe(self) -> str:
        """"batch of 3 rows (gear 4)" for the log and errors; a static model's has no gear."""
        rows = f"batch of {self.rows} row{'' if self.rows == 1 else 's'}"
        return rows if self.gear is None else f"{rows} (gear {self.gear})"


class BatchListener(Protocol):
    """Who hears from an executor. Both methods are called from the executor's threads and
    must not block (the batcher hops to its event loop; the pool hands on or re-launches)."""

    def batch_done(self, batch: Batch) -> None:
        """`batch` finished: its outputs or its error are set. Called exactly once per batch."""

    def slot_free(self) -> None:
        """A slot became free: the executor can take another batch."""


class InstanceListener(BatchListener, Protocol):
    """Who hears from a ModelInstance (its pool): a BatchListener that also takes back batches
    queued on the instance and never launched there."""

    def launching(self, batch: Batch) -> None:
        """The instance's launcher puts `batch` on the device now (it was not handed back). Called
        from the launcher thread; must not block."""

    def not_launched(self, batches: list[Batch]) -> None:
        """`batches`, in the order they were queued on the instance, were not launched: its device
        was found failed as a whole meanwhile (launcher.py). Their slots are back; the listener
        owns them again, to run elsewhere or answer, each once. Called from the instance's
        launcher thread; must not block."""


class BatchExecutor(Protocol):
    """What the batcher needs from a model version's instances (runtime.InstancePool)."""

    gears: tuple[int, ...]  # ascending; () for a static model (one request per run)
    gear_cost: dict[int, float]  # seconds per lone run of each gear, submit to result (warm-up)
    compute_cost: dict[int, float]  # seconds of device compute per gear (warm-up; may be empty)

    def attach(self, listener: BatchListener) -> None:
        """Send completions and freed slots to `listener` from now on."""

    def lanes(self) -> list[int]:
        """Per instance ("lane", by index), the slots that can take a batch now (0 when it
        takes none: busy, resetting after a fault, broken)."""

    def out_of_service(self) -> str | None:
        """Why no batch can run now (every instance out of rotation, each rebuild failed), or None."""

    def failed_for_good(self) -> Exception | None:
        """The error every batch fails with from now on, in this process (DeviceFailed: every
        instance is on a device that failed as a whole), or None. Never blocks."""

    def submit(self, batch: Batch) -> None:
        """Run `batch`; never blocks. Each request's arrays have its row count as first
        dimension (rows sum <= gear). With `batch.lane`, the batch runs on that instance
        (waiting for one of its slots if needed) unless it is out of rotation. The completion
        is the listener's batch_done(batch), with `batch.error` an ExecutionFailed naming what
        went wrong, or the outputs set; it may come before submit() returns."""
