"""Traces -> Chrome trace JSON ("traceEvents"), as ui.perfetto.dev and chrome://tracing read it.

Tracks (pid / tid, each named by "M" metadata events):
  host threads       the event loop (decode, encode, batch formation) and, per instance, its
                     launcher thread (pack, copy-in) and completion thread (copy-out, unpack);
                     a decode done off the loop is not drawn there (large gRPC contents
                     decoded in a worker thread; pictures in the images' decode pool: the
                     loop's part ends where they are handed over)
  instance <name>    its H2D, compute and D2H streams (device times, from events) and one
                     track per slot (the batch it holds, launch to result)
  requests           one lane per request in flight at once: the request, with its receive,
                     decode (its pictures' decode in the pool nested in it, "decode pictures"),
                     queue (until its batch's launch on an instance), execute and encode
                     phases nested inside
Flow arrows (ph s/f) link each request's dispatch (its batch's formation) to the batch it ran
in: a request of a failed batch re-run one request per run (runtime/isolation.py), to the run
that answered it, a batch of its own whose args name the failed one (`rerun_of`), which is drawn
as well. A failed run's slot span ends where its failure was known, named "... failed", its args
saying so (`failed`, `error`: the class it was answered with, `code`: the device's ACL error code
or null). A tid is unique in the file (pid * 10000 + the track's number), as some importers key
threads by tid alone. Spans are "X" events (ts and dur in microseconds of perf_counter_ns);
nothing is drawn for a phase whose timestamps were not reached (a request refused before its
queue, a device without timings). A request released without its outputs (answered with an
error, timed out in the queue, cancelled) is drawn to its release as one with them is: its
execute phase from its batch's launch, or its queue when it left that without a batch. One whose
client left once its batch was formed is held to that batch's end, as in Triton's format
(triton.py: its rows ran all the same), with a "client left" instant where the client went.
A file written in parts (files.py appends to it) renders each part with the same Builder: its
tracks are named once and an instance keeps its pid.
Names say which numbering a "#N" is: a request's trace id (Triton's trace "id", the `trace_id`
of its args) after "request" (`request #N` when it has no request id, `decode request #N`,
`encode request #N`), a batch's id after "batch" (`form batch #N`, `pack batch #N`, `enqueue
batch #N`, `unpack batch #N`, `H2D batch #N`, `compute batch #N`, `D2H batch #N`, the slot's
`batch #N ...`): the two count apart, so one number can name both a request and a batch.
"""
from __future__ import annotations

import heapq

import orjson

from .records import BatchTrace, RequestTrace

PID_HOST, PID_REQUESTS, PID_FIRST_INSTANCE = 1, 2, 10
TID_LOOP = 1
TID_H2D, TID_COMPUTE, TID_D2H, TID_FIRST_SLOT = 1, 2, 3, 10
CATEGORY = "aclserve"
STREAM_TRACKS = {"H2D stream": "copy in", "compute stream": "compute", "D2H stream": "copy out"}
REQUESTS_PROCESS = "requests (sampled)"


def global_tid(pid: int, tid: int) -> int:
    return pid * 10000 + tid


def render(traces: list[RequestTrace], dropped: int = 0) -> bytes:
    return orjson.dumps(document(traces, dropped))


def document(traces: list[RequestTrace], dropped: int = 0) -> dict:
    return {"traceEvents": events(traces), "displayTimeUnit": "ms", "otherData": other_data(len(traces), dropped)}


def other_data(requests: int, dropped: int) -> dict:
    """The document's fields after its events (a file appended to rewrites them, with its totals)."""
    return {"producer": "aclserve", "clock": "time.perf_counter_ns (CLOCK_MONOTONIC)",
            "requests": requests, "dropped": dropped}


def _us(ns: int) -> float:
    return ns / 1000.0


class Builder:
    """The events of one render, and the tracks named so far (kept by files.py across the parts
    of one file)."""

    def __init__(self):
        self.out: list[dict] = []
        self._named: set[tuple[int, int]] = set()
        self._instances: dict[str, int] = {}
        self._host_threads: dict[str, int] = {}
        self._meta("process_name", PID_HOST, None, "host threads")
        self._meta("process_sort_index", PID_HOST, None, sort_index=0)
        self._thread(PID_HOST, TID_LOOP, "event loop")
        self._requests_named = False

    def take(self) -> list[dict]:
        """The events made since the last take (the tracks named stay known)."""
        out, self.out = self.out, []
        return out

    def _meta(self, kind: str, pid: int, tid: int | None, name: str | None = None, sort_index: int | None = None):
        event = {"name": kind, "ph": "M", "pid": pid, "args": {"name": name} if name is not None
                 else {"sort_index": sort_index}}
        if tid is not None:
            event["tid"] = global_tid(pid, tid)
        self.out.append(event)

    def _thread(self, pid: int, tid: int, name: str) -> None:
        if (pid, tid) not in self._named:
            self._named.add((pid, tid))
            self._meta("thread_name", pid, tid, name)
            self._meta("thread_sort_index", pid, tid, sort_index=tid)

    def span(self, pid: int, tid: int, name: str, start: int, end: int, args: dict | None = None) -> None:
        if not start or not end or end < start:
            return
        event = {"name": name, "cat": CATEGORY, "ph": "X", "pid": pid, "tid": global_tid(pid, tid),
                 "ts": _us(start), "dur": _us(end - start)}
        if args:
            event["args"] = args
        self.out.append(event)

    def instant(self, pid: int, tid: int, name: str, at: int, args: dict | None = None) -> None:
        if at:
            self.out.append({"name": name, "cat": CATEGORY, "ph": "i", "s": "t", "pid": pid,
                             "tid": global_tid(pid, tid), "ts": _us(at), "args": args or {}})

    def flow(self, flow_id: int, start: tuple[int, int, int], end: tuple[int, int, int]) -> None:
        (pid0, tid0, t0), (pid1, tid1, t1) = start, end
        if t0 and t1:
            self.out.append({"name": "dispatch", "cat": CATEGORY, "ph": "s", "id": flow_id, "pid": pid0,
                             "tid": global_tid(pid0, tid0), "ts": _us(t0)})
            self.out.append({"name": "dispatch", "cat": CATEGORY, "ph": "f", "bp": "e", "id": flow_id,
                             "pid": pid1, "tid": global_tid(pid1, tid1), "ts": _us(t1)})

    def instance_pid(self, batch: BatchTrace) -> int:
        pid = self._instances.get(batch.instance)
        if pid is None:
            pid = self._instances[batch.instance] = PID_FIRST_INSTANCE + len(self._instances)
            self._meta("process_name", pid, None, f"instance {batch.instance} (device {batch.device})")
            self._meta("process_sort_index", pid, None, sort_index=pid)
            for tid, name in zip((TID_H2D, TID_COMPUTE, TID_D2H), STREAM_TRACKS):
                self._thread(pid, tid, name)
        return pid

    def host_tid(self, instance: str, role: str) -> int:
        key = f"{instance} {role}"
        tid = self._host_threads.get(key)
        if tid is None:
            tid = self._host_threads[key] = TID_LOOP + 1 + len(self._host_threads)
            self._thread(PID_HOST, tid, key)
        return tid


def events(traces: list[RequestTrace], b: Builder | None = None) -> list[dict]:
    """The traces' events; with `b`, a Builder used before, only the tracks it has not named yet
    are named."""
    b = b or Builder()
    ordered = sorted(traces, key=lambda t: t.arrival_ns)
    batches: dict[int, BatchTrace] = {}
    for trace in ordered:
        batch = trace.batch
        while batch is not None:  # (a re-run's failed batch too: drawn as it ran)
            batches.setdefault(batch.id, batch)
            batch = batch.rerun_of
    slot_tracks: dict[int, tuple[int, int]] = {}
    for batch in sorted(batches.values(), key=lambda x: x.formed_ns):
        slot_tracks[batch.id] = _batch(b, batch)
    lanes = _lanes(ordered)
    if not b._requests_named:
        b._requests_named = True
        b._meta("process_name", PID_REQUESTS, None, REQUESTS_PROCESS)
        b._meta("process_sort_index", PID_REQUESTS, None, sort_index=1)
    for trace, lane in zip(ordered, lanes):
        tid = lane + 1
        b._thread(PID_REQUESTS, tid, f"lane {lane}")
        _request(b, trace, tid)
        batch = trace.batch
        if batch is not None and batch.id in slot_tracks and batch.launched_ns:
            pid, slot_tid = slot_tracks[batch.id]
            b.flow(trace.id, (PID_REQUESTS, tid, trace.dispatched_ns), (pid, slot_tid, batch.launched_ns))
    return b.take()


def _lanes(ordered: list[RequestTrace]) -> list[int]:
    """Lowest free lane per request (by arrival), so overlapping requests never share a lane."""
    busy: list[tuple[int, int]] = []  # (end_ns, lane)
    free: list[int] = []
    lanes, next_lane = [], 0
    for trace in ordered:
        while busy and busy[0][0] <= trace.arrival_ns:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            lane, next_lane = next_lane, next_lane + 1
        lanes.append(lane)
        heapq.heappush(busy, (max(trace.end_ns, trace.held_ns, trace.arrival_ns), lane))
    return lanes


def _request(b: Builder, t: RequestTrace, tid: int) -> None:
    args = {"model": t.model, "version": t.version, "protocol": t.protocol, "status": t.status,
            "trace_id": t.id, "priority": t.level, "rows": t.rows}
    if t.request_id is not None:
        args["request_id"] = t.request_id
    if t.batch is not None:
        args["batch"] = t.batch.id
    label = t.request_id if t.request_id is not None else f"#{t.id}"
    held = t.held_ns  # (its batch's end, when its client left while that batch was formed or running)
    b.span(PID_REQUESTS, tid, f"request {label}", t.arrival_ns, max(t.end_ns, held), args)
    if held > t.end_ns:
        b.instant(PID_REQUESTS, tid, "client left", t.end_ns)
    b.span(PID_REQUESTS, tid, "receive", t.arrival_ns, t.received_ns)
    b.span(PID_REQUESTS, tid, "decode", t.received_ns, t.decoded_ns)
    b.span(PID_REQUESTS, tid, "decode pictures", t.pictures_ns, t.decoded_ns)  # (in the images' decode pool)
    # queued until its batch's launch on an instance (COMPUTE_START), as its statistics and log line count it;
    # a batch never launched (refused): until its formation; a request that left unbatched: until its release
    launched = t.batch.launched_ns if t.batch is not None else 0
    b.span(PID_REQUESTS, tid, "queue", t.enqueued_ns, launched or t.dispatched_ns or t.released_ns or t.end_ns)
    b.span(PID_REQUESTS, tid, "execute", launched, held)  # (its outputs back, its error, or its batch's end)
    b.span(PID_REQUESTS, tid, "encode", t.encode_start_ns, t.encoded_ns)
    # on the loop's track, beside its batches' spans: named by the request (its trace id), theirs by the batch
    of_request = {"trace_id": t.id}
    if t.decode_on_loop:  # its pictures, decoded in the pool's threads, are not the loop's
        b.span(PID_HOST, TID_LOOP, f"decode request #{t.id}", t.received_ns, t.pictures_ns or t.decoded_ns,
               of_request)
    b.span(PID_HOST, TID_LOOP, f"encode request #{t.id}", t.encode_start_ns, t.encoded_ns, of_request)


def _batch(b: Builder, batch: BatchTrace) -> tuple[int, int]:
    args = {"batch": batch.id, "model": batch.model, "gear": batch.gear, "rows": batch.rows,
            "padding": batch.padding, "requests": batch.requests,
            "priority_mix": {str(level): n for level, n in sorted(batch.levels.items())}}
    if batch.rerun_of is None:
        b.instant(PID_HOST, TID_LOOP, f"form batch #{batch.id}", batch.formed_ns, dict(args))
    else:  # (made by the runtime from the failed batch, not formed on the event loop)
        args["rerun_of"] = batch.rerun_of.id
    if not batch.launched_ns:
        return 0, 0
    pid = b.instance_pid(batch)
    slot_tid = TID_FIRST_SLOT + max(batch.slot, 0)
    b._thread(pid, slot_tid, f"slot {batch.slot}")
    args.update(instance=batch.instance, device=batch.device, slot=batch.slot, direct=batch.direct,
                attempts=batch.attempts)
    gear = batch.gear if batch.gear is not None else "static"
    outcome = ""
    if batch.error is not None:  # a failed run: launch to its failure known, with what it failed with
        args.update(failed=True, **batch.error)
        outcome = " failed"
    b.span(pid, slot_tid, f"batch #{batch.id} gear {gear} rows {batch.rows}{outcome}", batch.launched_ns,
           batch.done_ns, args)
    launcher = b.host_tid(batch.instance, "launcher")
    completion = b.host_tid(batch.instance, "completion")
    b.span(PID_HOST, launcher, f"pack batch #{batch.id}", batch.launched_ns, batch.packed_ns)
    b.span(PID_HOST, launcher, f"enqueue batch #{batch.id}", batch.packed_ns, batch.enqueued_ns)
    b.span(PID_HOST, completion, f"unpack batch #{batch.id}", batch.woke_ns, batch.done_ns)
    # a direct batch's copies (alone in flight) ran on its compute stream, before and after its
    # execution: drawn there, where they cannot overlap a piped batch's copies on the copy streams
    if batch.h2d:
        b.span(pid, TID_COMPUTE if batch.direct else TID_H2D, f"H2D batch #{batch.id}", *batch.h2d)
    if batch.d2h:
        b.span(pid, TID_COMPUTE if batch.direct else TID_D2H, f"D2H batch #{batch.id}", *batch.d2h)
    if batch.compute:
        b.span(pid, TID_COMPUTE, f"compute batch #{batch.id}", *batch.compute,
               {"gear": batch.gear, "rows": batch.rows})
    return pid, slot_tid
