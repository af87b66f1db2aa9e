"""The timestamps of one traced request and of one traced batch.

Every host timestamp is `time.perf_counter_ns()` (CLOCK_MONOTONIC on Linux, the clock Triton's
trace timestamps use too), taken by the thread that did the work. Device times are offsets from
an Anchor (an event of the instance whose host time is known, recorded on the stream the phase
ran on: runtime/device_clock.py), given by `event_elapsed_time`; they become host times when
read, with the anchor's host time as it stands then, so every batch measured from one anchor
moves with it when it is corrected.
0 means "not reached".
"""
from __future__ import annotations

import itertools
import time

now_ns = time.perf_counter_ns

# The status a request ends with when its client went away (nginx's): no answer was written to it
CLIENT_GONE = 499

_batch_ids = itertools.count(1)


class Anchor:
    """The host time of a device clock's anchor event; only ever lowered (corrected towards the
    true time) by the instance's completion thread."""

    __slots__ = ("host_ns",)

    def __init__(self, host_ns: int):
        self.host_ns = host_ns


class RequestTrace:
    """One request, filled by the transport (receive, decode, encode, end), the batcher (queue,
    batch) and the tracer (id, lane, target). `sampled` is False for a request followed only for the
    request log: then the batcher never sees it."""

    __slots__ = ("id", "target", "request_id", "model", "version", "protocol", "sampled", "arrival_ns",
                 "received_ns", "decoded_ns", "enqueued_ns", "dispatched_ns", "released_ns",
                 "result_ns", "encoded_ns", "end_ns", "status", "level", "rows", "batch", "queue_ns", "compute_ns",
                 "encode_start_ns", "decode_on_loop", "pictures_ns")

    def __init__(self, model: str, version: str, protocol: str, arrival_ns: int, sampled: bool = True):
        self.id = 0  # the tracer's number (Triton's trace "id"); 0 until it is finished
        self.target = None  # the tracer's: where it goes, as the settings said when it was sampled
        self.request_id = None  # KServe `id` or the X-Request-Id header
        self.model = model
        self.version = version
        self.protocol = protocol  # "http" | "grpc" | "inproc"
        self.sampled = sampled
        self.arrival_ns = arrival_ns
        self.received_ns = self.decoded_ns = self.enqueued_ns = self.dispatched_ns = 0
        # back from its queue or batch on the event loop whatever the outcome (its outputs, an error, a
        # timeout in the queue, cancelled): Triton's REQUEST_END; result_ns is the same moment on a success only
        self.released_ns = 0
        self.result_ns = self.encode_start_ns = self.encoded_ns = self.end_ns = 0
        self.status = 200  # HTTP status of the answer (gRPC answers use the same numbers)
        self.level = 0
        self.rows = 0
        self.batch: BatchTrace | None = None
        self.queue_ns = self.compute_ns = 0  # from the InferenceResult, for the request log
        self.decode_on_loop = True  # False: decoded in a worker thread (large gRPC contents)
        # its pictures handed to the images' decode pool (0: none, or decoded on the loop): its decode
        # from here to decoded_ns ran in the pool's threads
        self.pictures_ns = 0

    @property
    def held_ns(self) -> int:
        """When the server let go of the request (Triton's REQUEST_END): its release from its queue or
        batch, or, when its client left while its batch was formed or running, that batch's end: its
        rows ran all the same, and Triton releases a request only once the execution holding it
        ends (while that batch still runs: its launch, if later than the release)."""
        batch = self.batch
        if batch is None or not batch.launched_ns:
            return self.released_ns
        return max(self.released_ns, batch.done_ns or batch.launched_ns)


class BatchTrace:
    """One batch holding at least one sampled request. The batcher fills the formation, the
    instance's launcher thread the pack and copy-in, its completion thread the device times and
    the unpack. Written by one thread at a time, in that order (the hand-offs are queues and
    futures, which order the writes). A failed batch re-run one request per run (runtime/
    isolation.py) gives each sampled request's run a BatchTrace of its own (rerun()), its
    `rerun_of` the failed one."""

    __slots__ = ("id", "model", "gear", "rows", "requests", "levels", "formed_ns", "instance", "device",
                 "slot", "direct", "launched_ns", "packed_ns", "enqueued_ns",
                 "anchors", "device_spans", "woke_ns", "done_ns", "error", "attempts", "traces", "rerun_of")

    def __init__(self, model: str, gear: int | None, rows: int, requests: int, levels: dict[int, int],
                 formed_ns: int):
        self.id = next(_batch_ids)
        self.model = model
        self.gear = gear
        self.rows = rows
        self.requests = requests
        self.levels = levels  # priority level -> requests of the batch at that level
        self.formed_ns = formed_ns
        self.instance = ""
        self.device = -1
        self.slot = -1
        self.direct = False  # ran by the direct path: copies on the compute stream
        self.launched_ns = self.packed_ns = self.enqueued_ns = 0
        self.anchors: dict[str, Anchor] = {}  # "h2d" | "compute" | "d2h" -> the anchor of its stream
        self.device_spans: dict[str, tuple[int, int]] = {}  # the same -> offsets (ns) from that anchor
        self.woke_ns = self.done_ns = 0  # done_ns: its result, or its failure known (then `error` says which)
        self.error: dict | None = None  # a failed run: {"error": the class answered, "code": the ACL code or None}
        self.attempts = 0
        self.traces: dict[int, RequestTrace] = {}  # its sampled requests, by their place in the batch
        self.rerun_of: BatchTrace | None = None  # the failed batch whose request this one re-runs alone

    @property
    def padding(self) -> int:
        return (self.gear - self.rows) if self.gear is not None else 0

    def _device(self, name: str) -> tuple[int, int] | None:
        span, anchor = self.device_spans.get(name), self.anchors.get(name)
        if span is None or anchor is None:
            return None
        host = anchor.host_ns
        return host + span[0], host + span[1]

    # (start_ns, end_ns) of each phase on the host's axis, or None when unknown
    @property
    def h2d(self) -> tuple[int, int] | None:
        return self._device("h2d")

    @property
    def compute(self) -> tuple[int, int] | None:
        return self._device("compute")

    @property
    def d2h(self) -> tuple[int, int] | None:
        return self._device("d2h")

    # -- runtime hooks (launcher and completion threads) ------------------------------------------
    def launched(self, instance: str, device: int, slot: int, direct: bool, launched_ns: int = 0) -> None:
        """Its launch at `launched_ns` (the Batch's own stamp, which ends its requests' queue time)."""
        self.launched_ns = launched_ns or now_ns()
        self.instance, self.device, self.slot, self.direct = instance, device, slot, direct
        self.attempts += 1
        # a retried batch keeps only its last attempt (a failed one's end and error included)
        self.anchors, self.device_spans = {}, {}
        self.woke_ns = self.done_ns = 0
        self.error = None
        if self.rerun_of is not None:  # its request's compute is this run's from now on (not if it never runs)
            for trace in self.traces.values():
                trace.batch = self

    def failed(self, error: str, code: int | None) -> None:
        """Its run failed, known now (the completion thread's, or the launcher's for a launch given
        up): it ends here, as Triton's backends stamp a failed execution's end too."""
        self.done_ns = now_ns()
        self.error = {"error": error, "code": code}


def queued(trace: RequestTrace, request) -> None:
    """A sampled request entered its queue (QUEUE_START, as Triton's: a request that times out
    there has it too). `request` is the batcher's QueuedRequest."""
    trace.enqueued_ns = request.enqueued_ns
    trace.level = request.level
    trace.rows = request.rows


def form_batch(model: str, requests, gear: int | None, formed_ns: int) -> BatchTrace:
    """The BatchTrace of a batch being dispatched; `requests` are the batcher's QueuedRequests
    (anything with `.trace`, `.rows`, `.level`, `.enqueued_ns`). Links every sampled request to it."""
    levels: dict[int, int] = {}
    rows = 0
    for request in requests:
        levels[request.level] = levels.get(request.level, 0) + 1
        rows += request.rows
    batch = BatchTrace(model, gear, rows, len(requests), levels, formed_ns)
    for index, request in enumerate(requests):
        trace = request.trace
        if trace is not None:
            trace.dispatched_ns = formed_ns
            trace.batch = batch
            batch.traces[index] = trace
    return batch


def rerun(failed: BatchTrace, index: int, gear: int | None, rows: int) -> BatchTrace | None:
    """The BatchTrace of the run re-running request `index` of traced batch `failed` alone
    (runtime/isolation.py), or None when that request is not sampled. Its request links to it once
    it launches (launched()): its compute stamps are the run that answered it, the failed batch
    staying its `rerun_of`."""
    trace = failed.traces.get(index)
    if trace is None:
        return None
    batch = BatchTrace(failed.model, gear, rows, 1, {trace.level: 1}, now_ns())
    batch.traces[0] = trace
    batch.rerun_of = failed
    return batch
