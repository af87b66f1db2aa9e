"""What a pool leaves on the device: its instances not freed yet, and a word once none is left.

An instance is freed at its close once the device has let go of it; one abandoned then (its work
still runs: teardown.py) keeps its streams, events and memory, counted against the device, until
the device lets go of it later, which may be never. After a pool's close, the instances it has
not freed are those: the repository does not retry a load that left some (each attempt of a
model that hangs would leave one more, until the device ran out: repository/failures.py), and
retries it once none is left (`when_none`). Counted per pool, the instances a rebuild replaced
included, through each instance's `when_freed` (builder.py tracks every instance it makes).
"""
from __future__ import annotations

import collections
import logging
import threading
from typing import Callable

log = logging.getLogger(__name__)


class LeftOnDevice:
    """The instances of one pool made and not freed yet. Thread-safe: instances are freed by
    the thread that closes them, or by teardown's retry thread for an abandoned one."""

    def __init__(self):
        self._lock = threading.Lock()
        self._count = 0
        self._on_device: collections.Counter = collections.Counter()  # device id -> instances there not freed
        self._when_none: list[Callable[[], None]] = []

    def track(self, instance) -> None:
        """Count `instance` until everything it owns is freed (ModelInstance.when_freed)."""
        device_id = instance.device.id
        with self._lock:
            self._count += 1
            self._on_device[device_id] += 1
        instance.when_freed(lambda: self._freed(device_id))

    @property
    def count(self) -> int:
        """Instances not freed yet: after the pool's close, those abandoned or still closing."""
        with self._lock:
            return self._count

    def on(self, device) -> int:
        """Those of them on `device`, holding its memory (a load refused for want of it: builder.py)."""
        with self._lock:
            return self._on_device[device.id]

    def when_none(self, callback: Callable[[], None]) -> bool:
        """Run `callback` once no instance is left, in the thread that frees the last one. False,
        and nothing kept, when none is left now."""
        with self._lock:
            if not self._count:
                return False
            self._when_none.append(callback)
            return True

    def _freed(self, device_id: int) -> None:
        with self._lock:
            self._count -= 1
            self._on_device[device_id] -= 1
            callbacks, self._when_none = (self._when_none, []) if not self._count else ([], self._when_none)
        for callback in callbacks:
            try:
                callback()
            except Exception:  # noqa: BLE001 - the instance is freed all the same; its freeing must go on
                log.exception("a callback on the freeing of a pool's last instance failed")


def note_left(error: BaseException, left: LeftOnDevice) -> None:
    """Say on a failed load's `error` what its closed pool left on the device (read by `left_by`)."""
    error.left_on_device = left


def left_by(error: BaseException) -> LeftOnDevice | None:
    """What the pool of the load that failed with `error` left on the device, if it said."""
    return getattr(error, "left_on_device", None)
