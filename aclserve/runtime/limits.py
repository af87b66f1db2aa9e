"""Per-device stream and event limits, and the ledger that keeps a configuration inside them.

A device has a fixed number of streams and events (CANN docs, aclrtCreateStream and
aclrtCreateEvent: acl/soc_limits.py). Past the event limit the device does not fail: a record waits for an event to
be released, which for a server means a hang. So aclserve counts what each model needs before it
loads anything (instances x (3 streams + its context's), instances x (slots x 6 events + 6 for
the trace clock)) and refuses a model that would not fit, naming the numbers. A context holds 2
streams on the 310-class SoCs (its default one and one for internal synchronisation), 1 on the
910-class (soc_limits.context_streams): 5 streams an instance on a 310P, 4 on a 910B. The DVPP
decoder claims its context and stream here too (images/dvpp.py).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from ..errors import LoadError
from .device_clock import EVENTS as CLOCK_EVENTS

INSTANCE_STREAMS = 3  # h2d, compute, d2h; its context's own come on top (DeviceLedger.context_streams)
EVENTS_PER_SLOT = 6  # Slot.EVENTS
EVENTS_PER_INSTANCE = CLOCK_EVENTS  # DeviceClock's anchors: two on each of the 3 streams
# set_device's default context's stream and the runtime's internal one; the Device's management
# context's come on top
DEVICE_BASE_STREAMS = 2
# how to raise the limits, said in a refusal: the server's setting (an Engine, which has none, says its own)
SERVER_REMEDY = "set device_limits if this device allows more"


class ResourceLimitError(LoadError):
    """A model's instances and slots need more streams or events than the device has left."""


@dataclass(frozen=True)
class Need:
    streams: int
    events: int


class DeviceLedger:
    """Streams and events claimed on one device. Thread-safe; claims are released by their owner.
    `context_streams`: what a created context holds on the device's SoC (soc_limits.context_streams)."""

    def __init__(self, device_id: int, max_streams: int, max_events: int, context_streams: int,
                 remedy: str = SERVER_REMEDY):
        self.device_id = device_id
        self.remedy = remedy
        self.max_streams, self.max_events = max_streams, max_events
        self.context_streams = context_streams
        self._lock = threading.Lock()
        self.streams, self.events = DEVICE_BASE_STREAMS + context_streams, 0

    def context_need(self, streams: int, events: int = 0) -> Need:
        """What a context of its own takes with `streams` streams and `events` events made in it."""
        return Need(self.context_streams + streams, events)

    def need(self, instances: int, slots: int) -> Need:
        """What `instances` model instances of `slots` slots each take: a context, its 3 streams and their events."""
        one = self.context_need(INSTANCE_STREAMS, slots * EVENTS_PER_SLOT + EVENTS_PER_INSTANCE)
        return Need(instances * one.streams, instances * one.events)

    def claim(self, need: Need, what: str) -> None:
        with self._lock:
            streams, events = self.streams + need.streams, self.events + need.events
            if streams > self.max_streams or events > self.max_events:
                raise ResourceLimitError(
                    f"{what} needs {need.streams} streams and {need.events} events on device "
                    f"{self.device_id}, which allows {self.max_streams} streams and {self.max_events} "
                    f"events ({self.streams} and {self.events} already in use); give models fewer instances "
                    f"or slots, spread them over more devices, or {self.remedy}")
            self.streams, self.events = streams, events

    def release(self, need: Need) -> None:
        with self._lock:
            self.streams -= need.streams
            self.events -= need.events
