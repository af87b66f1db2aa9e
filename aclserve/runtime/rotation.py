"""Which of a pool's instances are out of rotation now, and the words the repository index says it in.

An instance leaves rotation for good (slot_book.py's `broken`: a batch past the execution timeout,
a context stopped on a failed batch, a stream reset that failed) until the rebuild of its lane swaps
a new one in (pool.py, replacement.py); one on a device found failed as a whole takes no batch either
(device_health.py). The version serves on with the others, READY. A tester found that a model
running at half its instances said so in the log only: the index READY with no reason, the
statistics an unexplained 0.0 for the instance, /metrics its rebuild counters alone. So the pool
lists them (`lanes_out`): /metrics counts them (aclserve_instances_out_of_rotation), the index's
reason sums them up (`summary`), the statistics mark each instance (`out_of_rotation`)."""
from __future__ import annotations

import dataclasses
import threading

from . import device_health

REBUILDING = "rebuilding"  # its rebuild runs, or waits to try again after a failed attempt
NOT_REBUILT = "not rebuilt"  # the pool rebuilds none, or its device failed as a whole
# characters of a failure the index's reason quotes (the log has it whole); its paths are shortened after
MAX_FAILURE = 300


@dataclasses.dataclass(frozen=True)
class OutOfRotation:
    lane: int
    rebuild: str  # REBUILDING or NOT_REBUILT
    last_failure: str  # why its rebuild's last attempt failed, or its device did; "" while neither


def lanes_out(instances, rebuilds: dict[int, threading.Thread] | None,
              failures: dict[int, str]) -> list[OutOfRotation]:
    """The lanes of `instances` that take no batch now, in order. `rebuilds`: lane -> its rebuild
    thread (None: the pool rebuilds none); `failures`: lane -> why its last rebuild attempt failed.
    A rebuild not started yet (the instance has just left) counts as running; one whose thread has
    ended with the instance still out gave up (its device failed as a whole)."""
    out = []
    for lane, instance in enumerate(instances):
        device_failure = device_health.known_failure(instance.device)
        if not instance.broken and device_failure is None:
            continue
        thread = rebuilds.get(lane) if rebuilds is not None else None
        rebuilding = rebuilds is not None and instance.broken and (thread is None or thread.is_alive())
        failure = failures.get(lane) or (str(device_failure) if device_failure is not None else "")
        out.append(OutOfRotation(lane, REBUILDING if rebuilding else NOT_REBUILT, failure))
    return out


def summary(out: list[OutOfRotation], total: int) -> str:
    """The index's reason for a READY version whose `out` of its `total` instances are out of
    rotation: "1 of 2 instances out of rotation (rebuilding; last failure: ...)"; "" with none."""
    if not out:
        return ""
    states = ", ".join(dict.fromkeys(lane.rebuild for lane in out))
    failure = next((lane.last_failure for lane in out if lane.last_failure), "")
    if len(failure) > MAX_FAILURE:
        failure = failure[:MAX_FAILURE - 3] + "..."
    detail = f"{states}; last failure: {failure}" if failure else states
    return f"{len(out)} of {total} instance{'s' if total > 1 else ''} out of rotation ({detail})"
