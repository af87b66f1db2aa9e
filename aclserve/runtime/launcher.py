"""The launcher thread of a ModelInstance, and the launch hand-over to it.

launch() (the pool, on any thread; it never blocks) queues a reserved slot and its batch for the
launcher thread: hand-off 1. The launcher puts the batches on the device in launch order, with
the ACL call sequences of enqueue.py: a batch alone in flight takes the direct path (copies and
execution all on the compute stream: nothing to overlap with, and the copy streams' wake-ups
are saved), any other the piped one over the three streams, so that with two or more slots
batch N+1 is packed and copied in while batch N computes. Each batch then goes to the
completion thread (hand-off 2) with the error its launch raised, if any: an enqueue failure
(bad argument, device error) fails that batch only.

The hand-over shares the instance's lock with its close (slot_book.py): launch() on an instance
whose close has begun answers the batch itself (ExecutionFailed) rather than queue it behind
the stop marker, where nobody would answer it. A close past its deadline with the launcher
still inside a launch (a hung pack, or a memcpy_async or execute_async call the device does not
return from) gives up on it (give_up): the batch the launcher holds and those queued behind it
are answered there, since the completion thread stops without them, and the launcher hands
nothing on when it comes back, then ends.

A batch the launcher takes once its device was found failed as a whole (device_health.py: by any
instance on it, another model's included) is not launched, nor those queued behind it: the device
would refuse them, and nothing more is sent to it. Their slots come back and they go back to the
pool, in order (`not_launched`), which runs them on an instance on a healthy device, or answers
them at once with DeviceFailed. The launcher owns each batch from its take off the queue until it
hands it on (to the completion thread, or back to the pool), or answers it (give_up, abandon).

A launch call that does not return while the instance serves is found by the completion thread
(completer.py: `launching_since`), which takes the instance out of rotation and abandons the
launch the same way (`abandon`): its batch and those queued behind it fail with DeviceTimeout
(retried on another instance), as a batch the device does not finish would.
"""
from __future__ import annotations

import logging
import queue
import time
import traceback

from ..acl import AclError
from ..errors import DeviceTimeout, ExecutionFailed
from ..trace.records import now_ns
from . import enqueue
from .batch import Batch, InstanceListener
from .completer import Completer
from .device import Device
from .instance_resources import InstanceResources
from .slot import Slot
from .slot_book import SlotBook

log = logging.getLogger("aclserve.runtime.instance")  # one logger for all of an instance's lines


class Launcher:
    """Owns the launcher thread and its queue, and what the thread holds (`_launching`, under
    the book's lock)."""

    def __init__(self, acl, resources: InstanceResources, book: SlotBook, completer: Completer,
                 device: Device, name: str):
        self._acl = acl
        self._resources = resources
        self._book = book
        self._completer = completer
        self._done_q = completer.queue  # hand-off 2
        self._device = device
        self.name = name
        self.listener: InstanceListener | None = None  # answers the batches refused here, takes back the unlaunched
        self._queue: queue.SimpleQueue = queue.SimpleQueue()  # hand-off 1
        self._launching: tuple[Slot, Batch] | None = None  # what the thread is putting on the device
        self._launch_start = 0.0  # when it began (time.monotonic())
        # close() or abandon() answered what the thread held: it hands nothing on, and takes
        # nothing new ((the reason why, the error class), for those it refuses)
        self._given_up: tuple[str, type] | None = None
        self.thread = None

    def start(self) -> None:
        self.thread = self._resources.start_thread("launch", self._run)

    def launch(self, slot: Slot, batch: Batch) -> None:
        """Run `batch` in `slot` (reserved from the book). On an instance whose close has begun
        the batch is answered here: its launcher has stopped, or stops before it."""
        with self._book.lock:
            given_up = self._given_up
            if not self._book.closing and given_up is None:
                self._queue.put((slot, batch))
                return
        if given_up is not None:  # reserved just before the instance left rotation, or closed
            self.refuse(slot, batch, *given_up)
        else:
            self.refuse(slot, batch, f"instance {self.name} was closed before the batch could run")

    def stop(self) -> None:
        """The thread hands on the batches queued before this call, then ends. Called under the
        book's lock as `closing` is set, so no batch is queued behind the marker."""
        self._queue.put(None)

    def refuse(self, slot: Slot, batch: Batch, why: str, error=ExecutionFailed) -> None:
        """Answer a batch that will not run (`error(why)`) and give its slot back."""
        self._book.return_slot(slot)
        batch.error = error(why)
        batch.outputs, batch.instance = None, self.name
        trace = batch.trace
        if trace is not None and trace.launched_ns and not trace.done_ns:  # a launch given up: it ends here
            trace.failed(error.__name__, None)
        self.listener.batch_done(batch)

    def give_up(self) -> None:
        """A close past its deadline with the thread still inside a launch: answer the batch the
        thread holds and those queued behind it here. The thread hands nothing on when it comes
        back, and then ends; the instance is abandoned meanwhile (its thread still runs), so
        nothing is freed under it."""
        why = f"instance {self.name} was closed while its launcher was still putting a batch on the device"
        self._answer_held(why, ExecutionFailed)

    def launching_since(self) -> float | None:
        """When the launch the thread is inside began (time.monotonic()), or None."""
        with self._book.lock:
            return self._launch_start if self._launching is not None else None

    def abandon(self, why: str) -> None:
        """A launch call that does not return (the instance is out of rotation already): answer
        the batch the thread holds, those queued behind it and any launched later with
        DeviceTimeout `why`; the thread hands nothing on when it comes back, then ends."""
        self._answer_held(why, DeviceTimeout)

    def _answer_held(self, why: str, error) -> None:
        with self._book.lock:
            if self._given_up is not None:
                return  # answered already (a hung launch abandoned, then the instance closed)
            self._given_up = (why, error)
            held = [self._launching] if self._launching is not None else []
            held += self._drain()[0]
            self._queue.put(None)  # a launcher between two batches stops at its next look
        for slot, batch in held:
            self.refuse(slot, batch, why, error)

    def _take_queued(self, first) -> tuple[list, bool]:
        """`first` and the batches queued behind it, taken off the queue in order (the book's lock
        held, as _answer_held takes them), and whether the stop marker was among them."""
        items, stop = self._drain()
        return [first] + items, stop

    def _drain(self) -> tuple[list, bool]:
        """Every batch queued, taken off in order (the book's lock held), and whether a stop
        marker was among them (dropped: the caller stops, or puts one back)."""
        items, stop = [], False
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return items, stop
            if item is None:
                stop = True
            else:
                items.append(item)

    def _hand_back(self, items) -> None:
        """The device was found failed as a whole after these batches were queued here: none is
        launched (the device would refuse it, and nothing more is sent to it). Their slots come
        back and the pool has them again, in order, to run elsewhere or answer (not_launched), then
        hears of the free slots as from the completion thread (what waits may be answered now)."""
        log.warning("%s: %d queued batch(es) not launched: device %d failed as a whole; handed back to the pool",
                    self.name, len(items), self._device.id)
        for slot, _ in items:
            if self._book.return_slot(slot):  # a reset pending: settled, not run (nothing runs here again), as
                self._book.reset_settled()    # the completion thread does on a failed device (free_slots)
        self.listener.not_launched([batch for _, batch in items])
        self.listener.slot_free()

    def _run(self) -> None:
        book, resources = self._book, self._resources
        while True:
            item = self._queue.get()
            if item is None:
                return
            slot, batch = item
            # alone in flight: nothing to overlap with, so skip the copy streams; and always where
            # the slot's events cannot be waited on by another stream batch after batch
            with book.lock:
                # given up between get() and here: _answer_held saw this batch neither held nor
                # queued, so it is answered here, not launched (it would be handed on to nobody)
                given_up = self._given_up
                unlaunched = self._take_queued(item) if given_up is None and self._device.health.code else None
                if given_up is None and unlaunched is None:
                    direct = book.in_flight == 1 or not slot.cross_stream
                    self._launching, self._launch_start = item, time.monotonic()
            if given_up is not None:
                self.refuse(slot, batch, *given_up)
                return
            if unlaunched is not None:
                items, stop = unlaunched
                self._hand_back(items)
                if stop:
                    return
                continue
            batch.launched_ns = now_ns()  # its requests' queue time ends here, as a trace's COMPUTE_START
            batch.error = None  # a re-run's first error goes as it runs (handed back unlaunched, it keeps it)
            self.listener.launching(batch)
            if batch.trace is not None:
                self._trace_launch(batch.trace, slot, direct, batch.launched_ns)
            error = None
            try:
                if direct:
                    enqueue.direct(self._acl, resources.model, resources.streams["compute"], slot, batch)
                else:
                    enqueue.piped(self._acl, resources.model, resources.streams, slot, batch)
            except AclError as e:  # the device refused a call (e.g. its context stopped on a failure)
                # its text, not the error: a handler keeping the record (pytest's) kept the error's
                # traceback, this frame and so the whole instance, long after its close
                log.error("%s: could not launch a batch: %s", self.name, str(e))
                error = e
            except Exception as e:  # a bug in the launch: this batch fails, its traceback logged as text (as above)
                log.error("%s: could not launch a batch\n%s", self.name, traceback.format_exc())
                error = e
            with book.lock:  # a close that gave up on this launch has answered the batch already
                self._launching = None
                if self._given_up is not None:
                    return
                self._done_q.put((slot, batch, error, direct))

    def _trace_launch(self, trace, slot: Slot, direct: bool, launched_ns: int) -> None:
        """Traced batches only: mark the launch (`launched_ns`, the batch's own), and anchor the
        device clock on each stream when it is stale (before this batch records its events;
        waiting no longer than the execution timeout on each). Tracing never fails a batch."""
        trace.launched(self.name, self._device.id, slot.index, direct, launched_ns)
        try:
            self._resources.clock.refresh_if_stale(self._resources.streams, self._completer.execution_timeout_ms)
        except AclError as e:
            log.warning("%s: trace clock not anchored (%s); device spans left out", self.name, e)
