"""Per-device stream and event limits, and the ledger that keeps a configuration inside them.

A device has a fixed number of streams and events (CANN docs, aclrtCreateStream and
aclrtCreateEvent: acl/soc_limits.py). Past the event limit the device does not fail: a record waits for an event to
be released, which for a server means a hang. So aclserve counts what each model needs before it
loads anything (instances x (3 streams + the context's default stream), instances x (slots x 6
events + 6 for the trace clock)) and refuses a model that would not fit, naming the numbers.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from ..errors import LoadError
from .device_clock import EVENTS as CLOCK_EVENTS

STREAMS_PER_INSTANCE = 4  # h2d, compute, d2h, and the default stream its context brings
EVENTS_PER_SLOT = 6  # Slot.EVENTS
EVENTS_PER_INSTANCE = CLOCK_EVENTS  # DeviceClock's anchors: two on each of the 3 streams
# set_device's default context, the Device's management context, the runtime's internal stream
DEVICE_BASE_STREAMS = 3


class ResourceLimitError(LoadError):
    """A model's instances and slots need more streams or events than the device has left."""


@dataclass(frozen=True)
class Need:
    streams: int
    events: int

    @staticmethod
    def of(instances: int, slots: int) -> "Need":
        return Need(instances * STREAMS_PER_INSTANCE, instances * (slots * EVENTS_PER_SLOT + EVENTS_PER_INSTANCE))


class DeviceLedger:
    """Streams and events claimed on one device. Thread-safe; claims are released by their owner."""

    def __init__(self, device_id: int, max_streams: int, max_events: int):
        self.device_id = device_id
        self.max_streams, self.max_events = max_streams, max_events
        self._lock = threading.Lock()
        self.streams, self.events = DEVICE_BASE_STREAMS, 0

    def claim(self, need: Need, what: str) -> None:
        with self._lock:
            streams, events = self.streams + need.streams, self.events + need.events
            if streams > self.max_streams or events > self.max_events:
                raise ResourceLimitError(
                    f"{what} needs {need.streams} streams and {need.events} events on device "
                    f"{self.device_id}, which allows {self.max_streams} streams and {self.max_events} "
                    f"events ({self.streams} and {self.events} already in use); lower instances or "
                    "slots, or set device_limits if this device allows more")
            self.streams, self.events = streams, events

    def release(self, need: Need) -> None:
        with self._lock:
            self.streams -= need.streams
            self.events -= need.events
