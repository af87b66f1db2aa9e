"""How many gRPC messages may be arriving at once.

grpc core keeps a call's message while it arrives, once the handler reads: gRPC announces no
size before a message and grpcio offers no memory quota, so a message cannot be charged to the
memory budget before it is whole (grpc_intake.py). What can be bounded is how many arrive at
once, each at most `grpc_max_message_bytes` (grpc's max_receive_message_length): `slots` =
max_inflight_bytes // that size, so messages still arriving hold at most max_inflight_bytes,
whatever the number of calls. The config refuses a message size that leaves fewer than
MIN_SLOTS (config/server.py: four such messages held more than the budget).

- A unary call (ModelInfer, and every other method but ModelStreamInfer) holds a slot while it
  reads its message and gives it back once the message is in. With none free, a read waits its
  turn (within its body timeout). While reads wait, the one that has held its slot longest, if
  for EVICT_AFTER_S or more, is ended (DEADLINE_EXCEEDED): a client sending slowly, or stopping
  short of its message's end, cannot keep the others out.
- A ModelStreamInfer stream always has a read open (for its next request), so it holds a slot
  for its whole life and is never ended for it; streams may hold at most half of the slots (a
  stream beyond is refused UNAVAILABLE with a pushback), so unary calls keep the other half.

Loop thread only.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from ..config.schema import GRPC_MIN_ARRIVING
from ..errors import Overloaded

log = logging.getLogger(__name__)

EVICT_AFTER_S = 1.0  # a message arriving slower than this keeps its slot only while none waits
MIN_SLOTS = GRPC_MIN_ARRIVING  # two streams and two unary reads (a config built otherwise still gets them)
REFUSAL_LOG_S = 60.0  # a stream refused is logged at most this often (the metric counts them all)


class Arrival:
    """One read's (or one stream's) place among the messages arriving: `end_early` is what ends
    its read when it is evicted (its deadline moved to now)."""

    __slots__ = ("stream", "end_early", "since", "evicted")

    def __init__(self, stream: bool = False):
        self.stream = stream
        self.end_early = None
        self.since = 0.0
        self.evicted = False


class Arrivals:
    @classmethod
    def for_config(cls, config) -> "Arrivals":
        return cls(config.max_inflight_bytes // config.grpc_max_message_bytes)

    def __init__(self, slots: int):
        self.slots = max(MIN_SLOTS, slots)
        self.stream_slots = self.slots // 2
        self.streams = 0  # streams admitted, holding a slot or waiting for one
        self.evicted = 0  # reads ended for others waiting (/metrics)
        self.streams_refused = 0
        self._logged_at = -REFUSAL_LOG_S  # the first refusal is logged
        self._free = self.slots
        self._holding: dict[Arrival, None] = {}  # oldest first
        self._waiting: deque[tuple[Arrival, asyncio.Future]] = deque()
        self._evicting = 0  # evicted reads not yet gone
        self._timer: asyncio.TimerHandle | None = None

    @property
    def holding(self) -> int:
        return len(self._holding)

    def open_stream(self) -> Arrival:
        """A stream's Arrival, to `admit`, then `leave` when the stream ends; Overloaded when
        streams hold their half of the slots."""
        if self.streams >= self.stream_slots:
            self.streams_refused += 1
            self._log_refusal()
            raise Overloaded(f"the server has {self.streams} gRPC streams open, as many as it receives "
                             f"at once (max_inflight_bytes / grpc_max_message_bytes / 2): retry later")
        self.streams += 1
        return Arrival(stream=True)

    def _log_refusal(self) -> None:
        """The operator's side of a refused stream (a load generator may not show its clients'
        errors): once a minute at most, with how to allow more."""
        now = time.monotonic()
        if now < self._logged_at + REFUSAL_LOG_S:
            return
        self._logged_at = now
        log.warning("gRPC ModelStreamInfer refused: %d streams open, as many as allowed (half of max_inflight_bytes "
                    "/ grpc_max_message_bytes = %d messages received at once); %d refused so far. Lower "
                    "grpc_max_message_bytes or raise max_inflight_bytes to allow more streams",
                    self.streams, self.slots, self.streams_refused)

    async def admit(self, arrival: Arrival) -> None:
        """Wait for a slot in turn. `arrival` holds it until `leave`, whatever happens after this
        returns; a cancelled wait holds nothing (but a stream stays counted until `leave`)."""
        if self._free and not self._waiting:
            self._free -= 1
            self._hold(arrival)
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append((arrival, waiter))
        self._evict_when_due()
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._give_back(arrival)  # the slot came with the cancellation
            else:
                self._waiting.remove((arrival, waiter))
            raise

    def leave(self, arrival: Arrival) -> None:
        """`arrival` is done: its slot (if it holds one) goes to the next read waiting."""
        if arrival.stream:
            arrival.stream = False
            self.streams -= 1
        if arrival in self._holding:
            self._give_back(arrival)

    def _hold(self, arrival: Arrival) -> None:
        arrival.since = asyncio.get_running_loop().time()
        self._holding[arrival] = None

    def _give_back(self, arrival: Arrival) -> None:
        del self._holding[arrival]
        if arrival.evicted:
            self._evicting -= 1
        while self._waiting:
            following, waiter = self._waiting.popleft()
            if not waiter.done():
                self._hold(following)
                waiter.set_result(None)
                return
        self._free += 1

    def _evict_when_due(self) -> None:
        """While more reads wait than are being evicted, end the reads that have held their slot
        longest, once they have for EVICT_AFTER_S; streams are never ended here."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        for arrival in self._holding:
            if len(self._waiting) <= self._evicting:
                return
            if arrival.evicted or arrival.stream or arrival.end_early is None:
                continue
            due = arrival.since + EVICT_AFTER_S
            if due > now:
                self._timer = loop.call_at(due, self._evict_when_due)
                return
            arrival.evicted = True
            self._evicting += 1
            self.evicted += 1
            arrival.end_early()
