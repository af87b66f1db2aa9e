"""A model instance: its own context, H2D/compute/D2H streams, its own model copy and slots.

Data flow of one batch:

    launcher thread    pack rows into the slot's host buffers (padding rows zeroed)
    H2D stream         record h2d_start, memcpy_async host->device per input, record h2d_end
    compute stream     wait h2d_end, record exec_start, execute_async, record exec_end
                       (set_dynamic_batch_size is an immediate write into the slot's dataset)
    D2H stream         wait exec_end, record d2h_start, memcpy_async device->host, record d2h_end
    completion thread  synchronize d2h_end, h2d_end and exec_end (GIL released), split rows
                       per request, time the three phases with event_elapsed_time, free the
                       slot, resolve

A batch launched while nothing else is in flight takes a shorter path: its copies and its
execution all go on the compute stream, the copies without events of their own (so untimed).
Nothing is there to overlap with, and the two copy streams' wake-ups are saved (about 0.1 ms
per batch on the CPU runtime). The copies stay asynchronous, so a hung copy is bounded by the
execution timeout like a hung execution (synchronous copies on the launcher and completion
threads were a little quicker on the CPU runtime, but a hung one held the batch and the
instance with no timeout). The ACL call sequences of both paths (and of the synchronous
baseline, `run_sync`) are in enqueue.py; this class owns the threads that run them, the slots
and the instance's health.

With two or more slots, batch N+1 is packed and copied while batch N computes. If a batch fails
on the device (an execute error) only that batch fails; the instance then stops taking work,
lets its other batches finish, resets its streams and serves again. A batch the device does
not finish within `execution_timeout_ms` fails with DeviceTimeout and takes the instance out of
rotation for good (`broken`): the batches behind it fail at once, and the pool builds a
replacement.

Every finished batch goes to the instance's listener (its pool) as `batch_done(batch)`, then its
slot is returned and the listener hears `slot_free()`; both from the completion thread. A batch
that will not run because the instance is closing is answered (ExecutionFailed) by the thread
that found out: launch() on a closed instance, or close() past its deadline for the batches a
launcher still stuck inside a launch holds (the completion thread stops without them).

Threads and state: the launcher thread owns packing and enqueueing; the completion thread owns
waiting, unpacking, timings (`_timing_failed`) and the stream reset (which runs only when no
batch is in flight, so the launcher is idle then; `streams` is touched by nobody else meanwhile).
Slot accounting and health (`_free`, `_in_flight`, `_needs_reset`, `broken`, `_closing`,
`_busy_*`, `faults`) and the launch hand-over (`_launching`, `_launches_given_up`) are written
under `_lock`; `broken` is also read without it where a stale answer only delays a decision by
one batch (the pool's health checks, the completion thread's fail-fast). `execution_timeout_ms`
is set by the pool (after warm-up) and read at each wait.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import math
import queue
import threading
import time

from ..acl import AclError, check, compat, release, restoring_context, using_context
from ..acl import constants as C
from ..errors import DeviceTimeout, ExecutionFailed
from ..trace.records import now_ns
from . import enqueue, teardown
from .batch import Batch, BatchListener
from .busy import BusyWindow
from .device import Device
from .device_clock import DeviceClock
from .event_times import phase_events, phase_timings
from .om_model import OmModel
from .packing import unpack
from .slot import Slot
from .types import DeviceTimings

log = logging.getLogger(__name__)


class ModelInstance:
    """Owns: an ACL context, three streams, an OmModel, `slots` Slots, a launcher and a
    completion thread. `try_reserve()` + `launch()` never block; close() waits for in-flight
    batches (until a deadline: what the device still runs then is abandoned, teardown.py), then
    releases everything in reverse order of acquisition."""

    def __init__(self, acl, device: Device, path: str, name: str, slots: int = 2,
                 execution_timeout_ms: int = 60_000, reset_timeout_ms: int = 10_000):
        if slots < 1:
            raise ValueError("an instance needs at least one slot")
        self._acl = acl
        self.device = device
        self.name = name
        # Longest wait for a batch's result (queued behind the other slots' batches included);
        # the pool sets it from the measured gear costs after warm-up.
        self.execution_timeout_ms = execution_timeout_ms
        # A device that failed a batch gets this long to drain before the instance is given up;
        # and a closing instance (unload, rebuild) before it is abandoned (teardown.py). The
        # model's `reset_timeout_ms`.
        self.reset_timeout_ms = reset_timeout_ms
        self._listener: BatchListener | None = None
        self._lock = threading.Lock()
        self._launch_q: queue.SimpleQueue = queue.SimpleQueue()
        self._done_q: queue.SimpleQueue = queue.SimpleQueue()
        self.context = 0
        self.streams: dict[str, int] = {}
        self.model: OmModel | None = None
        self.slots: list[Slot] = []
        self._free: list[Slot] = []
        self._in_flight = 0
        self._needs_reset = False
        self.broken: str | None = None  # reason, once the instance is out of rotation for good
        self.faults: collections.Counter[int] = collections.Counter()  # failed batches by ACL code
        self._busy_since: float | None = None
        self._busy_total = 0.0
        self._closing = False  # close() has begun (the first caller does the work): no new batch
        self._timing_failed = False
        self.clock: DeviceClock | None = None
        # fraction of recent wall time the compute stream executed (from events), for /metrics
        self.compute_busy = BusyWindow()
        self._launcher_thread: threading.Thread | None = None
        self._completer_thread: threading.Thread | None = None
        self._launching: tuple[Slot, Batch] | None = None  # what the launcher is putting on the device
        self._launches_given_up = False  # close() answered what the launcher held: it hands nothing on
        self._close_by = math.inf  # hurry(): the latest a close may wait for the device (time.monotonic())
        self._when_freed: list = []  # callbacks run once everything the instance owns is freed
        # Everything the instance owns is created under its own context (create_context makes it
        # current), and the calling thread gets its previous context back afterwards.
        with restoring_context(acl), contextlib.ExitStack() as undo:
            undo.callback(lambda: self.release(time.monotonic() + self.reset_timeout_ms / 1000))
            self.context = check("rt.create_context", acl.rt.create_context(device.id))
            self._create_streams()
            self.clock = DeviceClock(acl)
            self.model = OmModel(acl, device, path, name)
            self._ensure_slot_room(slots)
            for i in range(slots):
                self.slots.append(Slot(acl, self.model, i))
            undo.pop_all()
        self._free = list(self.slots)
        self._launcher_thread = self._start_thread("launch", self._launcher)
        self._completer_thread = self._start_thread("complete", self._completer)

    # -- set-up ----------------------------------------------------------------------------
    def _create_streams(self) -> None:
        for role in ("h2d", "compute", "d2h"):
            self.streams[role] = check("rt.create_stream", self._acl.rt.create_stream())

    def _ensure_slot_room(self, slots: int) -> None:
        per_slot = sum(self.model.input_sizes) + sum(self.model.output_sizes)
        self.device.ensure_room(f"model {self.name} ({slots} slots of buffers)", per_slot * slots)

    def _start_thread(self, role: str, target) -> threading.Thread:
        thread = threading.Thread(target=self._thread_main, args=(target,), name=f"{self.name}-{role}", daemon=True)
        thread.start()
        return thread

    def _thread_main(self, target) -> None:
        check("rt.set_context", self._acl.rt.set_context(self.context))  # contexts are per thread
        target()

    # -- what the pool calls -------------------------------------------------------------------
    def attach(self, listener: BatchListener) -> None:
        """Send finished batches and freed slots to `listener` (the pool), before any launch."""
        self._listener = listener

    @property
    def gears(self) -> tuple[int, ...]:
        return self.model.gears

    def free_count(self) -> int:
        with self._lock:
            return 0 if self._needs_reset or self.broken or self._closing else len(self._free)

    def try_reserve(self) -> Slot | None:
        with self._lock:
            if self._needs_reset or self.broken or self._closing or not self._free:
                return None
            if self._in_flight == 0:
                self._busy_since = time.monotonic()
            self._in_flight += 1
            return self._free.pop()

    def launch(self, slot: Slot, batch: Batch) -> None:
        """Run `batch` in `slot` (from try_reserve()); the outcome goes to the listener. An
        instance closed since the slot was reserved fails the batch here (its launcher has
        stopped); the check and close()'s stop marker share the lock, so no batch is queued
        behind the marker, where nobody would answer it."""
        with self._lock:
            if not self._closing:
                self._launch_q.put((slot, batch))
                return
        self._refuse(slot, batch, f"instance {self.name} was closed before the batch could run")

    def _refuse(self, slot: Slot, batch: Batch, why: str) -> None:
        """Answer a batch that will not run (ExecutionFailed `why`) and take its slot back."""
        self._return_slot(slot)
        batch.error = ExecutionFailed(why)
        batch.outputs, batch.instance = None, self.name
        self._listener.batch_done(batch)

    def busy_seconds(self) -> float:
        with self._lock:
            extra = time.monotonic() - self._busy_since if self._busy_since is not None else 0.0
            return self._busy_total + extra

    def run_sync(self, batch: Batch) -> Batch:
        """The unpipelined path, one batch at a time in the calling thread (benchmark baseline):
        pack, memcpy H2D, synchronous execute, memcpy D2H, unpack, under the instance's context
        (the caller's is restored). Blocking; errors raise. Its timings hold the execute's wall
        time (no events on this path; the call blocks until the device is done)."""
        acl = self._acl
        slot = self.try_reserve()
        if slot is None:
            raise RuntimeError(f"{self.name}: no free slot for a synchronous run")
        try:
            with using_context(acl, self.context):
                self._run_sync(slot, batch)
            return batch
        finally:
            self._return_slot(slot)

    def _run_sync(self, slot: Slot, batch: Batch) -> None:
        compute_ms = enqueue.synchronous(self._acl, self.model, slot, batch)
        self._finish(slot, batch, DeviceTimings(compute_ms=compute_ms))

    # -- launcher thread ---------------------------------------------------------------------
    def _launcher(self) -> None:
        while True:
            item = self._launch_q.get()
            if item is None:
                return
            slot, batch = item
            with self._lock:  # alone in flight: nothing to overlap with, so skip the copy streams
                direct = self._in_flight == 1
                self._launching = item
            if batch.trace is not None:
                self._trace_launch(batch.trace, slot, direct)
            error = None
            try:
                if direct:
                    enqueue.direct(self._acl, self.model, self.streams["compute"], slot, batch)
                else:
                    enqueue.piped(self._acl, self.model, self.streams, slot, batch)
            except Exception as e:  # enqueue failures (bad argument, device error) fail this batch only
                log.exception("%s: could not launch a batch", self.name)
                error = e
            with self._lock:  # a close that gave up on this launch has answered the batch already
                self._launching = None
                if self._launches_given_up:
                    return
                self._done_q.put((slot, batch, error, direct))

    # -- completion thread -------------------------------------------------------------------
    def _completer(self) -> None:
        while True:
            item = self._done_q.get()
            if item is None:
                return
            slot, batch, error, direct = item
            if error is None and self.broken:  # behind a hung batch: no point in waiting again
                error = DeviceTimeout(f"instance {self.name} was taken out of rotation ({self.broken})")
            if error is None:
                try:
                    self._collect(slot, batch, direct)
                except Exception as e:
                    error = e
            if error is not None:
                self._fail(batch, error)
            else:
                self.compute_busy.add(int(batch.timings.compute_ms * 1e6))
                if batch.trace is not None:
                    batch.trace.done_ns = now_ns()
            try:
                self._listener.batch_done(batch)
            except Exception:  # a listener's bug must not stop this thread: the slot comes back
                log.exception("%s: the listener failed on a finished batch", self.name)
            self._release_slot(slot)

    def _collect(self, slot: Slot, batch: Batch, direct: bool) -> None:
        ev = slot.events
        # d2h_end comes last (each stream waits for the one before; a direct batch has one
        # stream), so one wake-up covers all; the others are then complete and only report
        # whether their own part failed (an event reports its stream's errors since the previous
        # one: a failed input copy shows on h2d_end alone, or on exec_start for a direct batch,
        # whose copies have no events of their own).
        for name in ("d2h_end", "exec_start" if direct else "h2d_end", "exec_end"):
            self._wait(ev[name])
        if batch.trace is not None:
            self._trace_device(batch.trace, ev, copies=not direct)
        self._finish(slot, batch, self._timings(ev, copies=not direct))

    def _wait(self, event: int) -> None:
        """Wait for a batch's event; past the execution timeout the instance gives up for good
        (a device that hangs once is not trusted again; the pool rebuilds the instance)."""
        try:
            compat.synchronize_event(self._acl, event, self.execution_timeout_ms)
        except AclError as e:
            if e.ret != C.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT:
                raise
            with self._lock:
                self.broken = f"the device did not finish a batch within {self.execution_timeout_ms} ms"
            log.error("%s: %s; the instance leaves rotation and is rebuilt", self.name, self.broken)
            raise DeviceTimeout(f"the device did not finish the batch within the model's execution timeout "
                                f"({self.execution_timeout_ms} ms): {e}") from e

    def _finish(self, slot: Slot, batch: Batch, timings: DeviceTimings) -> None:
        """Write the batch's outcome: each request's rows out of the slot, timings, who ran it."""
        batch.outputs = unpack(slot, batch)
        batch.timings = timings
        batch.instance = self.name

    def _timings(self, ev: dict[str, int], copies: bool = True) -> DeviceTimings:
        """The batch's phase times; a timing error is logged once and never fails the batch."""
        try:
            return phase_timings(self._acl, ev, copies)
        except AclError as e:
            if not self._timing_failed:
                self._timing_failed = True
                log.warning("%s: device timings unavailable (%s); batches run on without them", self.name, e)
            return DeviceTimings()

    # -- trace hooks (traced batches only) -----------------------------------------------------
    def _trace_launch(self, trace, slot: Slot, direct: bool) -> None:
        """Launcher thread: mark the launch, and anchor the device clock when it is stale (before
        this batch records its events). Tracing never fails a batch."""
        trace.launched(self.name, self.device.id, slot.index, direct)
        try:
            self.clock.refresh_if_stale(self.streams["compute"], self.execution_timeout_ms)
        except AclError as e:
            log.warning("%s: trace clock not anchored (%s); device spans left out", self.name, e)

    def _trace_device(self, trace, ev: dict[str, int], copies: bool) -> None:
        """Completion thread, after the batch's last event: its device spans on the host's clock."""
        trace.woke_ns = now_ns()
        trace.anchor, trace.device_spans = self.clock.spans(phase_events(ev, copies), trace.woke_ns)

    def _fail(self, batch: Batch, error: BaseException) -> None:
        """Completion thread: the batch failed. A device error (not a timeout) makes the
        instance reset its streams once nothing else is in flight."""
        where = f"device {self.device.id}, instance {self.name}"
        cause = error if isinstance(error, AclError) else error.__cause__
        code = cause.ret if isinstance(cause, AclError) else None
        with self._lock:
            if code is not None:
                self.faults[code] += 1
            if not isinstance(error, DeviceTimeout):
                self._needs_reset = True
        if isinstance(error, DeviceTimeout):
            message = f"batch of {batch.rows} rows (gear {batch.gear}) on {where}: {error}"
            batch.error = DeviceTimeout(message)
        else:
            verb = "failed on" if isinstance(error, AclError) else "could not run on"
            message = f"batch of {batch.rows} rows (gear {batch.gear}) {verb} {where}: {error}"
            batch.error = ExecutionFailed(message)
        log.error("%s", message)
        batch.outputs = None
        batch.instance = self.name

    def fault_counts(self) -> dict[int, int]:
        """Failed batches by ACL error code (timeouts included), for /metrics. Any thread."""
        with self._lock:
            return dict(self.faults)

    def _return_slot(self, slot: Slot) -> bool:
        """Put the slot back; True when a pending stream reset can run now (nothing in flight)."""
        with self._lock:
            self._in_flight -= 1
            self._free.append(slot)
            if self._in_flight == 0 and self._busy_since is not None:
                self._busy_total += time.monotonic() - self._busy_since
                self._busy_since = None
            return self._needs_reset and self._in_flight == 0 and not self._closing and not self.broken

    def _release_slot(self, slot: Slot) -> None:
        if self._return_slot(slot):
            self._reset_streams()
        try:
            self._listener.slot_free()
        except Exception:
            log.exception("%s: the listener failed on a freed slot", self.name)

    def _reset_streams(self) -> None:
        """After a device fault: drain and recreate the streams (their errors are cleared)."""
        rt = self._acl.rt
        try:
            for role, stream in list(self.streams.items()):
                try:
                    compat.synchronize_stream(self._acl, stream, self.reset_timeout_ms)
                except AclError as e:
                    if e.ret == C.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT:
                        raise  # still busy: the device is not coming back
                    # else the fault that brought us here; destroying the stream clears it
                check("rt.destroy_stream", rt.destroy_stream(stream))
                del self.streams[role]
            self._create_streams()
        except AclError as e:
            with self._lock:
                self.broken = f"stream reset failed after a device fault: {e}"
            log.error("%s: %s; the instance stops taking work", self.name, self.broken)
            return
        log.warning("%s: streams reset after a device fault; serving again", self.name)
        with self._lock:
            self._needs_reset = False

    # -- teardown ----------------------------------------------------------------------------
    def close(self, deadline: float | None = None) -> None:
        """Stop the threads (in-flight batches finish first), then free everything, waiting for
        the device until `deadline` (time.monotonic(); default reset_timeout_ms from now), or
        until the earlier one `hurry()` sets meanwhile. An instance whose work still runs then is
        abandoned, not freed (teardown.py); a launcher still inside a launch then has its
        batches answered here (_give_up_launches). Safe twice, and from two threads (the pool
        closing while it disposes of a replaced instance)."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self._launch_q.put(None)  # the launcher hands its last batches on, then stops
        teardown.release_recovered()  # instances abandoned earlier whose device has let go since
        now = time.monotonic()
        if deadline is None:
            deadline = now + self.reset_timeout_ms / 1000
        # at least a moment of its own, however late it comes (its pool may have spent the
        # deadline waiting for a rebuild): an idle instance's threads stop within it
        floor = now + teardown.INSTANCE_GRACE_S
        with teardown.working_on(self.device.id):  # the runtime resets no device under this close
            if not teardown.join(self._launcher_thread, self._wait_bound(deadline, floor)):
                self._give_up_launches()
            self._done_q.put(None)  # queued after those batches: they complete first
            running = self.release(deadline, floor)
            if running is not None:
                teardown.abandon(self, running)

    def _give_up_launches(self) -> None:
        """close(), past its deadline with the launcher still inside a launch (a hung pack, or
        a memcpy_async or execute_async call the device does not return from): answer that
        batch and those queued behind it here, since the completion thread stops without them.
        The launcher hands nothing on when it comes back, and then ends; the instance is
        abandoned meanwhile (its thread still runs), so nothing is freed under it."""
        with self._lock:
            self._launches_given_up = True
            held = [self._launching] if self._launching is not None else []
            while True:
                try:
                    item = self._launch_q.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    held.append(item)
            self._launch_q.put(None)  # a launcher between two batches stops at its next look
        for slot, batch in held:
            self._refuse(slot, batch, f"instance {self.name} was closed while its launcher was still putting "
                                      f"a batch on the device")

    def hurry(self, deadline: float) -> None:
        """Wait for the device no later than `deadline` (time.monotonic()) in a close running now
        or to come: a shutdown arriving while an unload's close waits for a hung device."""
        self._close_by = min(self._close_by, deadline)

    def _wait_bound(self, deadline: float, floor: float):
        """When a close stops waiting for the device, read again as it waits: `deadline`, or
        hurry()'s earlier one, but not before `floor`."""
        return lambda: max(min(deadline, self._close_by), floor)

    def release(self, deadline: float, floor: float = 0.0) -> str | None:
        """Under the instance's context: once its threads have stopped and its streams are idle
        (waiting until `_wait_bound(deadline, floor)`), destroy the streams, then free slots and
        model, then destroy the context; the calling thread's context is restored. If the device
        still runs the instance's work then, nothing is freed and what runs is returned: that
        work reads and writes the slots' memory, which must not be freed under it."""
        acl = self._acl
        if not self.context:
            return None
        with using_context(acl, self.context):
            running = teardown.still_running(acl, (self._launcher_thread, self._completer_thread),
                                             self.streams, self._wait_bound(deadline, floor))
            if running is not None:
                return running
            for stream in self.streams.values():
                release("rt.destroy_stream", acl.rt.destroy_stream(stream))
            self.streams.clear()
            while self.slots:
                self.slots.pop().close()
            self._free = []
            if self.clock is not None:
                self.clock.close()
                self.clock = None
            if self.model is not None:
                self.model.close()
                self.model = None
            release("rt.destroy_context", acl.rt.destroy_context(self.context))
            self.context = 0
        callbacks, self._when_freed = self._when_freed, []
        for callback in callbacks:
            callback()
        return None

    def when_freed(self, callback) -> None:
        """Run `callback` once everything the instance owns is freed: at its close, or later for
        an instance abandoned then (teardown.py), whose streams and events still exist on the
        device meanwhile (its owner gives back its share of the device's ledger here)."""
        self._when_freed.append(callback)
