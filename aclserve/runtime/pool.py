"""The instances of one model version behind one BatchExecutor (builder.open_pool() builds them).

The pool hands each batch to the instance the batcher names (its "lane"), else to the one with the most free slots;
when none can take it the batch waits in a FIFO inside the pool (the batcher avoids that by watching lanes()). With
`retry`, a batch the device fails runs again: holding several requests or failed beside other batches, one request
per run, each alone on the instance it failed on once rebuilt, or a healthy one if that rebuild fails (isolation.py:
a request the model cannot run fails alone); else (or past the execution timeout) whole on another instance, if any.
The pool is its instances' BatchListener: finished batches and freed slots go on.

An instance that leaves rotation for good (a batch past the execution timeout, a context stopped on a failed batch,
a stream reset that failed) is rebuilt in a background thread (replacement.py): a fresh instance (context, streams,
model copy, slots) takes its lane and goes on with its busy windows (ModelInstance.continue_busy: /metrics' last 10
s), batches wait for it in the pool meanwhile (the batcher sees the lane busy), and the old one is closed
afterwards: freed once the device lets go of it, or abandoned after its reset_timeout_ms (teardown.py). None is
rebuilt on a device that failed as a whole, nor sent a batch (device_health.py, placement.py), and the batches
queued on one when that is found come back unlaunched (not_launched): with no other, the batches fail with
DeviceFailed."""
from __future__ import annotations

import collections
import functools
import logging
import math
import threading
import time
from typing import Callable

from ..errors import DeviceFailed, ExecutionFailed
from .batch import Batch, BatchListener
from . import device_health, isolation, placement, rotation, teardown
from .batch_faults import BatchFaults
from .execution_timeout import derived_timeout_ms
from .instance import ModelInstance
from .left_on_device import LeftOnDevice
from .rebuilder import Rebuilder
from .replacement import build_replacement
from .types import TensorSpec

log = logging.getLogger(__name__)


class InstancePool:
    """Owns its ModelInstances; close() closes them (blocking). A BatchExecutor to its owner,
    a BatchListener to its instances. `_pending` and the counters are under `_lock`."""

    def __init__(self, name: str, instances: list[ModelInstance], retry: bool = True,
                 builder: Rebuilder | None = None, left_on_device: LeftOnDevice | None = None):
        if not instances:
            raise ValueError("a pool needs at least one instance")
        self.name = name
        self.instances = instances
        self.retry = retry  # a failed batch re-run alone per request (isolation.py), or whole elsewhere
        self._isolation = isolation.Isolation(self._dispatch)
        model = instances[0].model
        self.inputs: list[TensorSpec] = list(model.inputs)
        self.outputs: list[TensorSpec] = list(model.outputs)
        self.gears: tuple[int, ...] = model.gears
        self.gear_cost: dict[int, float] = {}
        self.compute_cost: dict[int, float] = {}
        self._listener: BatchListener | None = None
        self._lock = threading.Lock()
        self._pending: collections.deque[Batch] = collections.deque()
        self._last_lane = -1  # the lane picked last: placement's ties are taken in turn after it
        self._closed = False
        self._retired = False  # retire(): its version is out of service, its rebuilt instances too
        self._close_callbacks: list[Callable[[], None]] = []
        self.batch_faults = BatchFaults()  # failed batches by outcome, and the re-runs they cost
        self.rebuilds = 0  # instances replaced after leaving rotation
        self.rebuilds_failed = 0  # rebuild attempts that failed (each tried again)
        self._rebuild_failures: dict[int, str] = {}  # lane -> why its last rebuild attempt failed
        self._rebuild_errors: dict[int, str] = {}  # lane -> that attempt's error, as the index quotes it
        self._builder = builder  # None: a broken instance stays out of rotation
        self.left_on_device = left_on_device or LeftOnDevice()  # its instances not freed yet, rebuilt ones' too
        self._rebuilding: dict[int, threading.Thread] = {}  # lane -> its rebuild thread
        self._backing_off: set[int] = set()  # lanes whose rebuild failed and waits to try again
        self._disposing: set[threading.Thread] = set()  # rebuild threads closing the instance they replaced
        self._retired_faults: collections.Counter[int] = collections.Counter()
        self._closing = threading.Event()
        self._close_by = math.inf  # hurry(): the latest close() may wait for the device (time.monotonic())
        self.execution_timeout_ms = instances[0].execution_timeout_ms
        for instance in instances:
            instance.attach(self)

    # -- BatchExecutor -------------------------------------------------------------------------
    def attach(self, listener: BatchListener | None) -> None:
        if listener is not None and self._listener is not None:  # (a warm-up of a pool its owner has)
            raise RuntimeError(f"{self.name}: the pool has its listener already")
        self._listener = listener

    def lanes(self) -> list[int]:
        with self._lock:
            free = device_health.free_slots(self.instances)  # (none on a failed device while another serves)
            for batch in self._pending:
                if batch.lane is not None and batch.failed_lane is None:
                    free[batch.lane] -= 1
            if self._isolation.active:  # (the parts of a failed batch run alone there: no room for others)
                free[self._isolation.lane] = 0
        return [max(n, 0) for n in free]

    def submit(self, batch: Batch) -> None:
        if batch.gear is not None and (batch.gear not in self.gears or batch.rows > batch.gear):
            raise ValueError(f"cannot run {batch.rows} rows in gear {batch.gear}; "
                             f"compiled gears are {list(self.gears)}")
        if batch.lane is not None and not 0 <= batch.lane < len(self.instances):
            raise ValueError(f"lane {batch.lane} is not an instance of {self.name}")
        self._dispatch(batch)

    def retire(self) -> None:
        """Its version is out of service: its instances' shares, rebuilt ones' too, go back (limits.py)."""
        with self._lock:  # (one rebuilt after this is retired by _serve_rebuilt)
            self._retired = True
            for instance in self.instances:
                instance.retire()

    # -- BatchListener (the instances' completion threads) ---------------------------------------
    def batch_done(self, batch: Batch) -> None:
        if batch.error is None and batch.failed_lane is None:
            self._listener.batch_done(batch)
            return
        if batch.error is not None:
            self._rebuild_broken()
            if self._rerun(batch):
                return
        self._answer(batch)

    def _answer(self, batch: Batch) -> None:  # (a part of a batch re-run per request: its whole, once whole)
        if (whole := self._isolation.finished(batch)) is not None:
            self.batch_faults.answered(batch, whole)
            self._listener.batch_done(whole)

    def _rerun(self, batch: Batch) -> bool:
        """Whether failed `batch` runs again (retry): alone per request (isolation.py), or elsewhere."""
        if not self.retry or isolation.is_part(batch) or self._closed or device_health.futile(batch, self.instances):
            return False
        device_failed = isinstance(batch.error, DeviceFailed)  # (no request's fault: whole, on a healthy device)
        if isinstance(batch.error, ExecutionFailed) and not device_failed and (len(batch.inputs) > 1 or batch.beside):
            log.warning("%s: re-running the %d request(s) of a failed batch alone", self.name, len(batch.inputs))
            self._isolation.add(batch, self.gears)
            return True
        if len(self.instances) < 2 or batch.failed_lane is not None:
            return False
        log.warning("%s: retrying a failed batch on another instance", self.name)
        batch.failed_lane, batch.failed_by = batch.ran_on, batch.ran_by
        self._dispatch(batch)
        return True

    def slot_free(self) -> None:
        ready, passed, stranded = [], [], []  # in FIFO order, each waiting batch that can now have a slot,
        with self._lock:  # while any is free (a look at every one: an Engine call of 16,000 runs, 51 s)
            free = sum(device_health.free_slots(self.instances))
            while self._pending and free > 0:
                batch = self._pending.popleft()
                target = self._pick(batch)
                if target is not None:
                    ready.append((batch, target))
                    free -= 1
                else:  # (answered if every instance that may run it is on a device found failed as a whole since)
                    (passed if placement.candidates(self.instances, batch) else stranded).append(batch)
            self._pending.extendleft(reversed(passed))
        for batch, target in ready:
            self._launch(batch, *target)
        self._answer_unrunnable(stranded, "no healthy instance can run the batch")
        if self._listener is not None:
            self._listener.slot_free()
        if self._builder is not None and any(i.broken for i in self.instances):
            self._rebuild_broken()  # e.g. a stream reset that failed as the slot came back

    def launching(self, batch: Batch) -> None:
        """(InstanceListener) An instance's launcher puts `batch` on the device now: a re-run is counted here, where
        it runs (counted when the pool gave it to an instance, one handed back unlaunched was taken back: a scrape
        between the two saw the counter go down). From the launcher thread; never blocks."""
        self.batch_faults.launched(batch)

    def not_launched(self, batches: list[Batch]) -> None:
        """(InstanceListener) Batches an instance's launcher handed back unlaunched, in their order: its device was
        found failed as a whole after they were queued there (launcher.py). Each goes where a new batch would (an
        instance on a healthy device; one that waits, ahead of the batches waiting already: it was dispatched
        first), or is answered at once (DeviceFailed, naming the model; a re-run with the error its run failed with
        first). From the launcher thread; never blocks."""
        waiting = 0
        for batch in batches:  # as before their launch: a new one never launched, a re-run where it failed
            batch.ran_on, batch.ran_by = batch.failed_lane, batch.failed_by
            waiting += self._dispatch(batch, place=waiting)

    # -- dispatch ---------------------------------------------------------------------------
    def _dispatch(self, batch: Batch, place: int | None = None) -> bool:
        """Launch, keep waiting (at `place` in the line, else last: True) or answer `batch`."""
        with self._lock:
            closed = self._closed  # (close() drains the pending batches under this lock: none after)
            target = None if closed else self._pick(batch)
            if target is None and not closed and self._may_wait(batch):  # a slot frees, or a rebuilt instance comes
                if place is None:
                    self._pending.append(batch)
                else:  # (a batch handed back unlaunched: not_launched)
                    self._pending.insert(place, batch)
                return True
        if closed:  # (checked under the lock: a batch put in _pending after close() drained it waited for good)
            batch.error = batch.error or ExecutionFailed(f"model {self.name} is closed")
            self._answer(batch)
        elif target is None:  # nothing healthy is left; a retry keeps its first error
            self._answer_unrunnable([batch], "no healthy instance can run the batch")
        else:
            self._launch(batch, *target)
        return False

    def _may_wait(self, batch: Batch) -> bool:
        """Whether an instance but the one `batch` failed on may take it, now or rebuilt (_futile)."""
        lanes = placement.candidates(self.instances, batch)
        if any(placement.usable(self.instances[k], batch) for k in lanes):
            return True
        return self._builder is not None and bool(lanes) and not self._futile(batch)

    def _futile(self, batch: Batch) -> bool:
        """Every instance that may run `batch` is broken, its rebuild failed again and backing off."""
        lanes = placement.candidates(self.instances, batch)
        return all(self.instances[k].broken and k in self._backing_off for k in lanes)

    def _answer_unrunnable(self, batches: list[Batch], why: str) -> None:
        for batch in batches:  # (a retry with its first error; every device failed as a whole: DeviceFailed)
            batch.error = batch.error or device_health.unrunnable(self.instances, self.name, why)
            self._answer(batch)

    def _launch(self, batch: Batch, lane: int, slot) -> None:
        batch.ran_on, batch.ran_by = lane, self.instances[lane]  # (its launcher clears a re-run's error as it runs it)
        self.instances[lane].launch(slot, batch)

    def _pick(self, batch: Batch) -> tuple[int, object] | None:  # a reserved (lane, slot), or None (placement.py)
        target = placement.pick(self.instances, batch, self._isolation, self._backing_off, self._last_lane)
        self._last_lane = self._last_lane if target is None else target[0]
        return target

    # -- instances out of rotation -------------------------------------------------------------
    def set_execution_timeout(self, configured_ms: int) -> int:
        """Set every instance's execution timeout: `configured_ms`, or with 0 one derived from the gears' costs."""
        timeout_ms = configured_ms if configured_ms > 0 else derived_timeout_ms(self.gear_cost)
        with self._lock:  # an instance a rebuild swaps in takes the value then (_rebuild)
            self.execution_timeout_ms = timeout_ms
            for instance in self.instances:
                instance.execution_timeout_ms = timeout_ms
        return timeout_ms

    def out_of_service(self) -> str | None:
        """Why no batch can run now (device_health.out_of_service), or None (requests wait)."""
        return device_health.out_of_service(self.instances, dict(self._rebuild_failures))

    def out_of_rotation(self) -> list[rotation.OutOfRotation]:
        """The lanes whose instance takes no batch now, and where their rebuild is (rotation.py)."""
        with self._lock:
            rebuilds = dict(self._rebuilding) if self._builder is not None else None
            return rotation.lanes_out(self.instances, rebuilds, dict(self._rebuild_errors))

    def rotation_note(self) -> str:
        """The index's reason while the version serves with instances out of rotation, else ""."""
        return rotation.summary(self.out_of_rotation(), len(self.instances))

    def failed_for_good(self) -> DeviceFailed | None:  # (BatchExecutor; no probe: never blocks)
        return device_health.failed_everywhere(self.instances)

    def fault_counts(self) -> dict[int, int]:
        """The device's faults by ACL error code, over the pool's life (rebuilt instances included)."""
        with self._lock:
            total = collections.Counter(self._retired_faults)
            instances = list(self.instances)
        for instance in instances:
            total.update(instance.fault_counts())
        return dict(total)

    def _rebuild_broken(self) -> None:
        """Start a rebuild for every broken instance that has none yet (completion threads)."""
        if self._builder is None:
            return
        with self._lock:  # (started under it: close() never sees one that has not started)
            if self._closed:
                return
            lanes = [k for k, i in enumerate(self.instances) if i.broken and k not in self._rebuilding]
            for lane in lanes:
                self._rebuilding[lane] = threading.Thread(target=self._replace, args=(lane,), daemon=True,
                                                          name=f"{self.name}-rebuild{lane}")
                self._rebuilding[lane].start()

    def _replace(self, lane: int) -> None:
        """Rebuild thread: build a fresh instance for `lane` (replacement.py), swap it in, then dispose of the old
        one. The runtime resets no device under it (a close of the pool may stop waiting for this thread)."""
        old = self.instances[lane]
        with teardown.working_on(old.device.id, old.device.owner):
            new, old_disposed = build_replacement(self, lane, old, self._builder, self._closing)
            if new is not None:
                self._serve_rebuilt(lane, old, new, old_disposed)

    def _serve_rebuilt(self, lane: int, old: ModelInstance, new: ModelInstance, old_disposed: bool) -> None:
        """Swap `new` in for `old`: it takes over the execution timeout and the busy windows (the last
        10 s hold the old one's busy time and the rebuild as idle), then the batches that waited go."""
        new.attach(self)
        with self._lock:
            closed = self._closed
            if not closed:
                new.execution_timeout_ms = self.execution_timeout_ms  # (set_execution_timeout() may have run since)
                new.continue_busy(old)  # (before it is seen: no scrape reads it counted from its build)
                self.instances[lane] = new
                if self._retired:  # (its share on its way back as the others': limits.py)
                    new.retire()
                self.rebuilds += 1
                self._rebuild_failures.pop(lane, None)
                self._rebuild_errors.pop(lane, None)
                self._backing_off.discard(lane)
                self._retired_faults.update(old.fault_counts())
                del self._rebuilding[lane]
                if not old_disposed:  # close() waits for this thread until the old one is closed
                    self._disposing.add(threading.current_thread())
        if closed:
            self._builder.dispose(new)
            return
        log.info("%s: instance %s rebuilt; serving again", self.name, new.name)  # a recovery: the fault warned
        try:
            self.slot_free()  # launches the batches that waited, wakes the batcher
        finally:  # (the replaced instance is this thread's alone to close, whatever slot_free raised)
            if not old_disposed:
                self._builder.dispose(old)  # waits for the device to let go of the hung batch, bounded
            with self._lock:
                self._disposing.discard(threading.current_thread())

    def rebuild_attempt_failed(self, lane: int, why: str, error: str, backing_off: bool) -> None:
        """A rebuild attempt of `lane` failed (replacement.RebuildingPool; several lanes' may at once)."""
        with self._lock:
            self._rebuild_failures[lane], self._rebuild_errors[lane] = why, error
            self.rebuilds_failed += 1
            if backing_off:
                self._backing_off.add(lane)

    def rebuild_backs_off(self) -> None:
        """A rebuild failed again and waits, or gave up (replacement.RebuildingPool): batches waiting for it are
        answered once _futile(), and parts of a failed batch waiting for its lane may go to a healthy one (_pick)."""
        self._answer_pending_if_futile()
        self.slot_free()

    def _answer_pending_if_futile(self) -> None:
        """The batches waiting in the pool are answered once _futile() (they waited for good)."""
        with self._lock:
            if self._closed:
                return
            futile, kept = [], collections.deque()
            for batch in self._pending:
                (futile if self._futile(batch) else kept).append(batch)
            self._pending = kept
        self._answer_unrunnable(futile, self.out_of_service() or "no instance can run a batch")

    # -- runs, figures, teardown --------------------------------------------------------------
    def busy_ratio(self) -> float:
        """Fraction of the last 10 s the instances had work in flight (averaged over instances)."""
        return sum(i.busy_fraction() for i in self.instances) / len(self.instances)

    def utilisation(self) -> list[dict]:
        """Per instance: the share of the last BusyWindow its compute stream executed (device events),
        and whether it is out of rotation (its figure then the time before it left)."""
        out = {lane.lane for lane in self.out_of_rotation()}
        return [{"instance": i.name, "device": i.device.id, "compute_busy": round(i.compute_busy.fraction(), 4),
                 "out_of_rotation": k in out} for k, i in enumerate(self.instances)]

    def close(self, deadline: float | None = None) -> None:
        """Blocking: wait for in-flight batches, then close every instance, waiting for the device until
        `deadline` (time.monotonic(); default the instances' reset_timeout_ms from now; at least
        teardown.GRACE_S): an instance still running then is abandoned (teardown.py). Safe twice."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        now = time.monotonic()
        default = now + max(i.reset_timeout_ms for i in self.instances) / 1000
        deadline = min(max(default if deadline is None else deadline, now + teardown.GRACE_S), self._close_by)
        with self._lock:
            pending, self._pending = list(self._pending), collections.deque()
            rebuilding = [*self._rebuilding.values(), *self._disposing]
        for batch in pending + self._isolation.drain():  # answered before any wait for the device
            batch.error = ExecutionFailed(f"model {self.name} was unloaded")
            self._answer(batch)
        for thread in rebuilding:  # one building an instance finishes and disposes of it, or the one it replaced
            if not teardown.join(thread, lambda: min(deadline, self._close_by)):
                log.warning("%s: %s is still waiting for the device; closing without it", self.name, thread.name)
        errors = teardown.close_at_once([functools.partial(i.close, deadline) for i in self.instances])
        for callback in self._close_callbacks:
            try:
                callback()
            except Exception as e:  # keep closing the others; report at the end
                errors.append(e)
        if errors:
            raise errors[0]

    def hurry(self, deadline: float) -> None:
        """Wait for the device no later than `deadline` (time.monotonic(); at least teardown.GRACE_S
        from now) in a close running now or to come (a shutdown during an unload's close)."""
        deadline = max(deadline, time.monotonic() + teardown.GRACE_S)
        with self._lock:
            self._close_by = min(self._close_by, deadline)
            instances = list(self.instances)
        for instance in instances:
            instance.hurry(deadline)

    def on_close(self, callback: Callable[[], None]) -> None:
        """Run `callback` at the end of close(), after the instances are closed."""
        self._close_callbacks.append(callback)
