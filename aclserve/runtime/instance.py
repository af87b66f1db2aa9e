"""A model instance: its own context, H2D/compute/D2H streams, its own model copy and slots.

Data flow of one batch:

    launcher thread    pack rows into the slot's host buffers (padding: the last real row again)
    H2D stream         record h2d_start, memcpy_async host->device per input, record h2d_end
    compute stream     wait h2d_end, record exec_start, execute_async, record exec_end
                       (set_dynamic_batch_size is an immediate write into the slot's dataset)
    D2H stream         wait exec_end, record d2h_start, memcpy_async device->host, record d2h_end
    completion thread  synchronize d2h_end, h2d_end and exec_end (GIL released; where the
                       streams do not stop on a failure, then the streams: completer.py), split
                       rows per request, time the three phases with event_elapsed_time, free
                       the slot, resolve

A batch launched while nothing else is in flight takes a shorter path: its copies and its
execution all go on the compute stream, the copies without events of their own (timed by the events around them).
Nothing is there to overlap with, and the two copy streams' wake-ups are saved (about 0.1 ms
per batch on the CPU runtime). The copies stay asynchronous, so a hung copy is bounded by the
execution timeout like a hung execution (synchronous copies on the launcher and completion
threads were a little quicker on the CPU runtime, but a hung one held the batch and the
instance with no timeout).

ModelInstance puts together one part per concept, each in its own module:

    instance_resources.py  the ACL objects it owns (context, streams, clock, model, slots):
                           made in order, freed streams first (release, when_freed)
    slot_book.py           slot accounting and health (free_count, try_reserve, broken,
                           faults, busy time) and the instance's one lock; ModelInstance is a
                           SlotBook, so the pool's per-batch calls reach it directly
    launcher.py            the launcher thread and the launch hand-over (launch, give_up)
    completer.py           the completion thread: waits, outcome, timings, failures, the
                           stream reset after a device fault, the slot's return
    enqueue.py             the ACL call sequences of a batch (direct, piped, synchronous)
    teardown.py            a close bounded in time: what the device still runs is abandoned

and keeps here what ties them: construction, the pool's surface, the synchronous baseline
(run_sync) and close(), which stops the threads in order and releases the resources.

If a batch fails on the device (an execute or copy error), where its streams stop on a failure
(compat.stop_on_failure) its context takes no task again: the batches in flight fail and the
instance leaves rotation for good (`broken`), and the pool builds a replacement; where they
cannot, the instance has one slot, only that batch fails, and the instance resets its streams
and serves again (completer.py). A batch the device does not finish within
`execution_timeout_ms` fails with DeviceTimeout and takes the instance out of rotation for good:
the batches behind it fail at once, and the pool builds a replacement. So does a launch call
that does not return within it (the completion thread watches the launcher: completer.py).

Every finished batch goes to the instance's listener (its pool) as `batch_done(batch)`, then its
slot is returned and the listener hears `slot_free()`; both from the completion thread. A batch
that will not run because the instance is closing is answered (ExecutionFailed) by the thread
that found out: launch() on a closed instance, or close() past its deadline for the batches a
launcher still stuck inside a launch holds (the completion thread stops without them).
"""
from __future__ import annotations

import math
import time

from ..acl import using_context
from . import enqueue, teardown
from .batch import Batch, InstanceListener
from .busy import BusyWindow
from .completer import Completer, finish
from .device import Device
from .device_clock import DeviceClock
from .instance_resources import InstanceResources
from .launcher import Launcher
from .om_model import OmModel
from .slot import Slot
from .slot_book import SlotBook
from .types import DeviceTimings


class ModelInstance(SlotBook):
    """Owns: an ACL context, three streams, an OmModel, `slots` Slots, a launcher and a
    completion thread. `try_reserve()` + `launch()` never block; close() waits for in-flight
    batches (until a deadline: what the device still runs then is abandoned, teardown.py), then
    releases everything it owns (instance_resources.py: streams first, the context last)."""

    def __init__(self, acl, device: Device, path: str, name: str, slots: int = 2,
                 execution_timeout_ms: int = 60_000, reset_timeout_ms: int = 10_000):
        if slots < 1:
            raise ValueError("an instance needs at least one slot")
        self._acl = acl
        self.device = device
        self.name = name
        self._resources = InstanceResources(acl, device, path, name, slots, reset_timeout_ms)
        super().__init__(self._resources.slots)
        self._close_by = math.inf  # hurry(): the latest a close may wait for the device (time.monotonic())
        self._retired = False  # retire(): its version is out of service, its close to come
        self._completer = Completer(acl, self._resources, self, device, name, execution_timeout_ms, reset_timeout_ms)
        self._launcher = Launcher(acl, self._resources, self, self._completer, device, name)
        self._completer.launcher = self._launcher  # watched for a launch call that does not return
        try:
            self._launcher.start()
            self._completer.start()
        except BaseException:  # ("can't start new thread" at the process's limit): free what was made
            self.close(time.monotonic())
            raise

    # -- what the pool calls (and SlotBook's free_count, try_reserve, broken, faults) ------------
    def attach(self, listener: InstanceListener) -> None:
        """Send finished batches and freed slots to `listener` (the pool), before any launch."""
        self._launcher.listener = self._completer.listener = listener

    def launch(self, slot: Slot, batch: Batch) -> None:
        """Run `batch` in `slot` (from try_reserve()); the outcome goes to the listener. An
        instance closed since the slot was reserved fails the batch here (launcher.py)."""
        self._launcher.launch(slot, batch)

    @property
    def execution_timeout_ms(self) -> int:
        """Longest wait for a batch's result (queued behind the other slots' batches included);
        the pool sets it from the measured gear costs after warm-up."""
        return self._completer.execution_timeout_ms

    @execution_timeout_ms.setter
    def execution_timeout_ms(self, ms: int) -> None:
        self._completer.execution_timeout_ms = ms

    @property
    def reset_timeout_ms(self) -> int:
        """How long a device that failed a batch gets to drain before the instance is given up;
        and a closing instance (unload, rebuild) before it is abandoned (teardown.py). The
        model's `reset_timeout_ms`."""
        return self._completer.reset_timeout_ms

    @reset_timeout_ms.setter
    def reset_timeout_ms(self, ms: int) -> None:
        self._completer.reset_timeout_ms = ms

    @property
    def compute_busy(self) -> BusyWindow:
        """The fraction of recent wall time the compute stream executed (from events), for /metrics."""
        return self._completer.compute_busy

    def restart_busy(self) -> None:
        """The busy time so far, in flight and on the compute stream, is not load: count from now."""
        super().restart_busy()
        self.compute_busy.restart()

    def continue_busy(self, predecessor: ModelInstance) -> None:
        """Before this instance serves in `predecessor`'s place (a rebuild): both busy windows go on
        from its, so the last 10 s hold its busy time and the rebuild as idle, not only the time since."""
        super().continue_busy(predecessor)
        self.compute_busy.continue_from(predecessor.compute_busy)

    @property
    def context(self) -> int:
        return self._resources.context

    @property
    def streams(self) -> dict[str, int]:
        return self._resources.streams

    @property
    def clock(self) -> DeviceClock | None:
        return self._resources.clock

    @property
    def model(self) -> OmModel | None:
        return self._resources.model

    @property
    def slots(self) -> list[Slot]:
        return self._resources.slots

    @property
    def gears(self) -> tuple[int, ...]:
        return self.model.gears

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
                compute_ms = enqueue.synchronous(acl, self.model, slot, batch)
                finish(slot, batch, DeviceTimings(compute_ms=compute_ms), self.name)
            return batch
        finally:
            self.return_slot(slot)

    # -- teardown ----------------------------------------------------------------------------
    def close(self, deadline: float | None = None) -> None:
        """Stop the threads (in-flight batches finish first), then free everything, waiting for
        the device until `deadline` (time.monotonic(); default reset_timeout_ms from now), or
        until the earlier one `hurry()` sets meanwhile. An instance whose work still runs then is
        abandoned, not freed (teardown.py); a launcher still inside a launch then has its
        batches answered here (Launcher.give_up). Safe twice, and from two threads (the pool
        closing while a rebuild thread closes the instance it has not replaced yet)."""
        with self.lock:
            if self.closing:
                return
            self.closing = True
            self._launcher.stop()  # the launcher hands its last batches on, then stops
        teardown.release_recovered(wait_s=0)  # instances abandoned earlier whose device has let go since
        now = time.monotonic()
        if deadline is None:
            deadline = now + self.reset_timeout_ms / 1000
        # at least a moment of its own, however late it comes (its pool may have spent the
        # deadline waiting for a rebuild): an idle instance's threads stop within it
        floor = now + teardown.INSTANCE_GRACE_S
        with teardown.working_on(self.device.id, self.device.owner):  # the runtime resets no device under this close
            launcher = self._launcher.thread  # (None: its start failed)
            if launcher is not None and not teardown.join(launcher, self._wait_bound(deadline, floor)):
                self._launcher.give_up()
            self._completer.stop()  # queued after those batches: they complete first
            running = self.release(deadline, floor)
            if running is not None:
                teardown.abandon(self, running)

    def hurry(self, deadline: float) -> None:
        """Wait for the device no later than `deadline` (time.monotonic()) in a close running now
        or to come: a shutdown arriving while an unload's close waits for a hung device."""
        self._close_by = min(self._close_by, deadline)

    def _wait_bound(self, deadline: float, floor: float):
        """When a close stops waiting for the device, read again as it waits: `deadline`, or
        hurry()'s earlier one, but not before `floor`."""
        return lambda: max(min(deadline, self._close_by), floor)

    def release(self, deadline: float, floor: float = 0.0) -> str | None:
        """Once the threads have stopped and the streams are idle (waiting until
        `_wait_bound(deadline, floor)`), free everything the instance owns (instance_resources.py:
        streams first, the context last). If the device still runs the instance's work then, nothing is
        freed and what runs is returned: that work reads and writes the slots' memory, which
        must not be freed under it. teardown.py calls it again for an abandoned instance."""
        running = self._resources.release((self._launcher.thread, self._completer.thread),
                                          self._wait_bound(deadline, floor))
        if running is None:
            self.forget_slots()
        return running

    def retire(self) -> None:
        """Its version is out of service (draining, its close to come): its share of the device's
        streams and events is on its way back (leaving)."""
        self._retired = True

    def leaving(self) -> bool:
        """Whether its share of the device's ledger is on its way back: retired or closing (one
        abandoned stays so until freed), which a load's check before its compile counts as back (limits.py)."""
        return self._retired or self.closing

    def when_freed(self, callback) -> None:
        """Run `callback` once everything the instance owns is freed: at its close, or later for
        an instance abandoned then (teardown.py), whose streams and events still exist on the
        device meanwhile (its owner gives back its share of the device's ledger here)."""
        self._resources.when_freed(callback)
