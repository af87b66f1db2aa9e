"""Building the replacement of a pool's instance out of rotation, in the pool's rebuild thread for
its lane (pool.py, which swaps it in once built).

Build first, so that a new instance serves as soon as it can; when that fails, the old instance
is let go of before the next try: it may hold what the new one needs (device memory that cannot
hold two copies of the model), and it serves nothing any more. Later failures are tried again
with backoff and jitter; a device that failed as a whole (DeviceFailed) is given up at once. Each
failure goes to the pool's records (`rebuild_attempt_failed`), and after each the batches waiting
for the lane may go elsewhere, or are answered (`rebuild_backs_off`)."""
from __future__ import annotations

import logging
import random
import threading
from typing import Protocol

from ..errors import DeviceFailed
from . import device_health
from .instance import ModelInstance
from .rebuilder import Rebuilder

log = logging.getLogger(__name__)


class RebuildingPool(Protocol):
    """What a rebuild reads of its pool and tells it (pool.InstancePool)."""
    name: str
    execution_timeout_ms: int  # read at each try: set_execution_timeout() may change it meanwhile

    def rebuild_attempt_failed(self, lane: int, why: str, error: str, backing_off: bool) -> None:
        """An attempt failed with `error` (why the lane's rebuild is failing: `why`); `backing_off`: the
        lane waits before the next one."""

    def rebuild_backs_off(self) -> None:
        """The rebuild waits to try again, or gave up: what waits for its lane may go elsewhere, or
        is answered."""


def build_replacement(pool: RebuildingPool, lane: int, old: ModelInstance, builder: Rebuilder,
                      closing: threading.Event) -> tuple[ModelInstance | None, bool]:
    """A new instance for `lane` in place of `old` (blocking), or None once the pool is `closing`
    or the device failed as a whole; and whether `old` was disposed of meanwhile (else the
    caller does, once the new one serves)."""
    if not device_health.on_failed_device(old):  # (on a device that failed as a whole none is: the builder says so)
        log.warning("%s: rebuilding instance %s (%s)", pool.name, old.name, old.broken)
    delay, old_disposed = 1.0, False
    while True:
        try:
            return builder.build(lane, pool.execution_timeout_ms), old_disposed
        except Exception as e:
            gave_up = isinstance(e, DeviceFailed)  # none can serve there again: no other rebuild of the lane
            why = str(e) if gave_up else f"rebuilding failed ({e}); trying again"
            # (a first failure is tried again at once, the old instance closed: no backing off yet)
            pool.rebuild_attempt_failed(lane, why, str(e), backing_off=old_disposed or gave_up)
            if closing.is_set():  # (closed meanwhile: no "trying again" after the close)
                return None, old_disposed
            if not old_disposed and not gave_up:
                log.warning("%s: rebuilding instance %s failed (%s); closing it first, then trying again",
                            pool.name, old.name, e)
                builder.dispose(old)  # waits for the device to let go, bounded
                old_disposed = True
                continue
            if not gave_up:  # (the builder said why not: builder.py)
                log.error("%s: rebuilding %s failed (%s); trying again in %.1f s", pool.name, old.name, e, delay)
            pool.rebuild_backs_off()
            if gave_up or closing.wait(delay * random.uniform(0.5, 1.0)):
                return None, old_disposed
            delay = min(2 * delay, 60.0)
