"""The completion thread of a ModelInstance: each launched batch's wait, outcome and slot.

Batches come from the launcher in launch order (hand-off 2), each with the error its launch
raised, if any. For each batch the thread waits for its events (GIL released): past
`execution_timeout_ms` the instance leaves rotation for good (DeviceTimeout; a device that
hangs once is not trusted again, and the pool rebuilds the instance), and the batches behind
it then fail at once. Then it takes each request's rows out of the slot (packing.unpack),
times the three phases (event_times.py; a timing error is logged once and never fails a
batch) and, for a traced batch, places its device spans on the host's clock.

How a failed execution or copy shows: in CANN's default mode an event recorded after a failed
task completes all the same, and its synchronize returns 0 (compat.stop_on_failure). So the
instance's streams stop on a failure where the CANN and SoC can: the batch's event then reports
it, the whole context stops (it takes no task again), and the instance leaves rotation to be
rebuilt, failing the batches in flight. Where they cannot, the instance has one slot, and after
a batch's event this thread synchronizes its streams, idle by then, which reports (and clears)
their failures: such a batch fails alone, and the instance takes no new batch until it has reset
its streams, here, when the slot comes back (the launcher is idle then); on a device found failed
as a whole, which no batch goes to again, the reset is left out.

While it waits for the launcher, the thread also looks, every half execution timeout, at how
long the launcher has been inside its current launch: a launch call that does not return (an
execute_async or memcpy_async blocking in the driver) past the execution timeout takes the
instance out of rotation too, and its batch and those behind it fail with DeviceTimeout
(Launcher.abandon). It is noticed within one and a half execution timeouts of its start while
this thread is idle, up to one more while it waits on an earlier batch's events.

Every finished batch goes to the listener (the pool) as `batch_done(batch)`, then its slot is
returned and the listener hears `slot_free()`. A listener that raises is logged; the thread
goes on and the slot still comes back.
"""
from __future__ import annotations

import logging
import queue
import time

from ..acl import AclError, compat
from ..acl import constants as C
from ..errors import DeviceFailed, DeviceTimeout, ExecutionFailed
from ..trace.records import now_ns
from .batch import Batch, BatchListener
from . import device_health
from .busy import BusyWindow
from .device import Device
from .event_times import phase_events, phase_timings
from .instance_resources import InstanceResources
from .packing import unpack
from .slot import Slot
from .slot_book import SlotBook
from .types import DeviceTimings

log = logging.getLogger("aclserve.runtime.instance")  # one logger for all of an instance's lines


def finish(slot: Slot, batch: Batch, timings: DeviceTimings, instance: str) -> None:
    """Write the batch's outcome: each request's rows out of the slot, timings, who ran it."""
    batch.outputs = unpack(slot, batch)
    batch.timings = timings
    batch.instance = instance


class Completer:
    """Owns the completion thread and its queue (`queue`: what the launcher hands on, None to
    stop), the timeouts it waits with, the compute stream's BusyWindow it feeds, and whether
    timings have failed once already."""

    def __init__(self, acl, resources: InstanceResources, book: SlotBook, device: Device, name: str,
                 execution_timeout_ms: int, reset_timeout_ms: int):
        self._acl = acl
        self._resources = resources
        self._book = book
        self._device = device
        self.name = name
        # fraction of recent wall time the compute stream executed (from events), for /metrics
        self.compute_busy = BusyWindow()
        # Longest wait for a batch's result (queued behind the other slots' batches included);
        # the pool sets it from the measured gear costs after warm-up. Read at each wait.
        self.execution_timeout_ms = execution_timeout_ms
        # How long a device that failed a batch gets to drain before the instance is given up.
        self.reset_timeout_ms = reset_timeout_ms
        self.listener: BatchListener | None = None
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.launcher = None  # the instance's Launcher, watched for a launch call that does not return
        self._timing_failed = False
        self._stopped = False  # out of rotation because its context stopped on a failed batch
        self.thread = None

    def start(self) -> None:
        self.thread = self._resources.start_thread("complete", self._run)

    def stop(self) -> None:
        """The thread ends after the batches queued before this call."""
        self.queue.put(None)

    def _next(self):
        """The next item the launcher hands on; meanwhile, every half execution timeout, a look
        at the launch it is inside (`_watch_launch`)."""
        while True:
            try:
                return self.queue.get(timeout=self.execution_timeout_ms / 2000)
            except queue.Empty:
                self._watch_launch()

    def _watch_launch(self) -> None:
        """A launch call past the execution timeout takes the instance out of rotation, and its
        batches fail with DeviceTimeout (a driver call that does not return is not trusted
        again, as a batch the device does not finish; the pool rebuilds the instance)."""
        since = self.launcher.launching_since() if self.launcher is not None else None
        if since is None or time.monotonic() - since < self.execution_timeout_ms / 1000 or self._book.closing:
            return  # (a close gives up on the launch itself, past its own deadline: Launcher.give_up)
        if not self._book.broken:
            self._leave_rotation(f"a launch call did not return within {self.execution_timeout_ms} ms")
            # counted as a timeout, the code /metrics names for one past the execution timeout
            self._book.count_failure(C.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT, needs_reset=False)
        self.launcher.abandon(self._out_of_rotation())

    def _leave_rotation(self, reason: str) -> None:
        """For good: the pool rebuilds the instance (a hung batch, a launch call that never
        returned, a context stopped on a failure)."""
        self._book.take_out_of_rotation(reason)
        rebuilt = "is not rebuilt: its device failed as a whole" if self._device.health.code else "is rebuilt"
        log.error("%s: %s; the instance leaves rotation and %s", self.name, reason, rebuilt)

    def _out_of_rotation(self) -> str:
        """Why a batch behind the instance's leaving rotation fails."""
        return f"instance {self.name} was taken out of rotation ({self._book.broken})"

    def _run(self) -> None:
        while True:
            item = self._next()
            if item is None:
                return
            slot, batch, error, direct = item
            if error is None and self._book.broken:  # behind a hung or stopped batch: no point in waiting
                error = (ExecutionFailed if self._stopped else DeviceTimeout)(self._out_of_rotation())
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
                self.listener.batch_done(batch)
            except Exception:  # a listener's bug must not stop this thread: the slot comes back
                log.exception("%s: the listener failed on a finished batch", self.name)
            self._release_slot(slot)

    def _collect(self, slot: Slot, batch: Batch, direct: bool) -> None:
        ev = slot.events
        # d2h_end comes last (each stream waits for the one before; a direct batch has one
        # stream): the batch is done once it is. The other two are synchronized too (complete by
        # then: no wait) before event_elapsed_time reads them: some chips fill an event's
        # timestamp in only when it is synchronized or queried (hicann/runtime Event::ElapsedTime)
        for name in ("d2h_end", "exec_start" if direct else "h2d_end", "exec_end"):
            self._wait(ev[name])
        if not self._resources.stops_on_failure:
            self._check_streams()
        if batch.trace is not None:
            self._trace_device(batch.trace, ev, direct)
        finish(slot, batch, self.timings(ev, direct), self.name)

    def _wait(self, event: int) -> None:
        """Wait for a batch's event; past the execution timeout the instance gives up for good
        (a device that hangs once is not trusted again; the pool rebuilds the instance)."""
        try:
            compat.synchronize_event(self._acl, event, self.execution_timeout_ms)
        except AclError as e:
            if e.ret != C.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT:
                raise
            self._leave_rotation(f"the device did not finish a batch within {self.execution_timeout_ms} ms")
            raise DeviceTimeout(f"the device did not finish the batch within the model's execution timeout "
                                f"({self.execution_timeout_ms} ms): {e}") from e

    def _check_streams(self) -> None:
        """Where streams do not stop on a failure: whether the batch's work failed, from its
        streams' synchronize (one slot: nothing else runs on them; an error is cleared once told)."""
        for stream in self._resources.streams.values():
            try:
                compat.synchronize_stream(self._acl, stream, self.execution_timeout_ms)
            except AclError as e:
                if e.ret == C.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT:  # not idle after the batch's last event
                    self._leave_rotation(f"a stream was still busy {self.execution_timeout_ms} ms after its batch")
                    raise DeviceTimeout(f"a stream of the batch did not finish within the model's execution "
                                        f"timeout ({self.execution_timeout_ms} ms): {e}") from e
                raise

    def timings(self, ev: dict[str, int], direct: bool = False) -> DeviceTimings:
        """The batch's phase times; a timing error is logged once and never fails the batch."""
        try:
            return phase_timings(self._acl, ev, direct)
        except AclError as e:
            if not self._timing_failed:
                self._timing_failed = True
                log.warning("%s: device timings unavailable (%s); batches run on without them", self.name, e)
            return DeviceTimings()

    def _trace_device(self, trace, ev: dict[str, int], direct: bool) -> None:
        """After the batch's last event (traced batches only): its device spans on the host's clock."""
        trace.woke_ns = now_ns()
        trace.anchors, trace.device_spans = self._resources.clock.spans(phase_events(ev, direct), direct,
                                                                        trace.woke_ns)

    def _fail(self, batch: Batch, error: BaseException) -> None:
        """The batch failed. A device error (not a timeout) makes the instance reset its
        streams once nothing else is in flight, or, where its streams stop on a failure (their
        context then takes no task again), leave rotation to be rebuilt."""
        where = f"device {self._device.id}, instance {self.name}"
        batch.beside = self._book.overlapped  # (which batch in flight faulted is not known)
        cause = error if isinstance(error, AclError) else error.__cause__
        code = device_code = cause.ret if isinstance(cause, AclError) else None
        timeout = isinstance(error, DeviceTimeout)
        probe = code is not None and not timeout  # a device error may have failed the whole device (device_health.py)
        stopped = self._resources.stops_on_failure and code is not None and not timeout
        # (before _leave_rotation, which says so; a batch behind the one that found it fails with it too)
        whole = device_health.failure(self._device) if probe else device_health.known_failure(self._device)
        if self._stopped:
            code = None  # (the stop is counted once, with the first batch it failed)
        elif stopped and not self._book.broken:
            # which batch in flight faulted is not known: the first one waited on reports it
            self._stopped = True
            self._leave_rotation(f"the device failed a task ({code}) and the instance's context stopped on it")
        self._book.count_failure(code, needs_reset=not timeout and not stopped)
        if isinstance(error, DeviceTimeout):
            message = f"{batch.describe()} on {where}: {error}"
            batch.error = DeviceTimeout(message)
        else:
            # (an ExecutionFailed here: in flight when its context stopped on another batch's failure)
            verb = "failed on" if isinstance(error, (AclError, ExecutionFailed)) else "could not run on"
            message = f"{batch.describe()} {verb} {where}: {error}"
            batch.error = ExecutionFailed(message) if whole is None else DeviceFailed(f"{message}; {whole}")
            batch.error.__cause__ = error  # a device's error, or the host code's (repository/retry.py)
        log.error("%s", message)
        batch.outputs = None
        batch.instance = self.name
        if batch.trace is not None:  # (its slot span in the Chrome trace; COMPUTE_END in Triton's)
            batch.trace.failed(type(batch.error).__name__, device_code)

    def _release_slot(self, slot: Slot) -> None:
        if self._book.return_slot(slot):
            self._reset_streams()
        try:
            self.listener.slot_free()
        except Exception:
            log.exception("%s: the listener failed on a freed slot", self.name)

    def _reset_streams(self) -> None:
        """After a device fault, nothing in flight: drain and recreate the streams (their errors
        are cleared); an instance whose streams cannot be reset leaves rotation for good. On a
        device found failed as a whole nothing runs again (device_health.py keeps batches off it),
        so it is not touched: the reset is left out, and settled all the same, as its free slots
        are what device_health.free_slots offers when every instance is on a failed device (the
        batches formed for them are then answered at once)."""
        failed = device_health.known_failure(self._device)
        if failed is not None:
            self._book.reset_settled()
            log.info("%s: streams not reset after the device fault: %s; the instance takes no batch again",
                     self.name, failed)
            return
        try:
            self._resources.reset_streams(self.reset_timeout_ms)
        except AclError as e:
            reason = f"stream reset failed after a device fault: {e}"
            self._book.take_out_of_rotation(reason)
            log.error("%s: %s; the instance stops taking work", self.name, reason)
            return
        log.info("%s: streams reset after a device fault; serving again", self.name)
        self._book.reset_settled()
