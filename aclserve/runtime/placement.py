"""Which of a pool's instances (its "lanes", by index) a batch may run on, and the one it gets.

The pool (pool.py) asks with its lock held; nothing here blocks beyond an instance's own lock
(try_reserve). No batch goes back to the instance it failed on (`batch.failed_by`: that lane's
rebuilt instance may take it), nor to one on a device found failed as a whole
(device_health.on_failed_device), a first run or a re-run alike.
"""
from __future__ import annotations

from . import device_health, isolation
from .batch import Batch


def _may_run(instance, batch: Batch) -> bool:
    """Not the instance `batch` failed on (its lane's rebuilt one may), nor one on a device found failed
    as a whole (none is rebuilt there)."""
    return instance is not batch.failed_by and not device_health.on_failed_device(instance)


def usable(instance, batch: Batch) -> bool:
    """Whether `instance` may take `batch` now: one that may run it (_may_run), in rotation."""
    return not instance.broken and _may_run(instance, batch)


def candidates(instances, batch: Batch) -> list[int]:
    """The lanes that may run `batch`, now or once rebuilt (_may_run)."""
    return [k for k, instance in enumerate(instances) if _may_run(instance, batch)]


def pick(instances, batch: Batch, parts: isolation.Isolation, backing_off: set[int],
         after: int = -1) -> tuple[int, object] | None:
    """A reserved (lane, slot) for `batch`, or None. A named lane is kept while usable (the batch
    waits for its slot); a retry goes wherever a slot is free, but where it failed. While parts
    of a failed batch are left (`parts`), one instance runs only them, one with nothing else in
    flight (isolation.py): the one it failed on (rebuilt), or, its rebuild backing off
    (`backing_off`: lanes), a healthy one. Otherwise the usable instance with the most free slots,
    ties taken in turn: the first after lane `after` (the one picked last) wins, so one batch at a
    time is not always run by the first instance (its device hotter than the others)."""
    held = parts.lane if parts.active else None
    if held is not None and isolation.is_part(batch):
        return parts.reserve(instances, backing_off)
    wanted = batch.lane if batch.failed_lane is None and batch.lane != held else None
    if wanted is not None and usable(instances[wanted], batch):
        slot = instances[wanted].try_reserve()
        return (wanted, slot) if slot is not None else None
    best, best_free = None, 0
    count = len(instances)
    for lane in ((after + 1 + k) % count for k in range(count)):
        instance = instances[lane]
        if lane == held or not usable(instance, batch):
            continue
        free = instance.free_count()
        if free > best_free:
            best, best_free = lane, free
    slot = instances[best].try_reserve() if best is not None else None
    return (best, slot) if slot is not None else None
