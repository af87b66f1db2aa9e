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
  stream beyond is refused with StreamsFull, UNAVAILABLE with a pushback, said on the stream
  first: grpc_stream_refused.py), so unary calls keep the other half.

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
REFUSAL_LOG_S = 60.0  # refused streams are logged at most this often (the metric counts them all)


class StreamsFull(Overloaded):
    """A stream refused: streams hold their half of the slots."""


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
        self._unlogged = 0  # refused streams not yet said in the log
        self._logged_at: float | None = None  # (monotonic) when they last were
        self._free = self.slots
        self._holding: dict[Arrival, None] = {}  # oldest first
        self._waiting: deque[tuple[Arrival, asyncio.Future]] = deque()
        self._evicting = 0  # evicted reads not yet gone
        self._timer: asyncio.TimerHandle | None = None

    @property
    def holding(self) -> int:
        return len(self._holding)

    def open_stream(self) -> Arrival:
        """A stream's Arrival, to `admit`, then `leave` when the stream ends; StreamsFull when
        streams hold their half of the slots."""
        if self.streams >= self.stream_slots:
            self.streams_refused += 1
            self._refusal_to_log()
            raise StreamsFull(f"the server has {self.streams} gRPC streams open, as many as it allows (half of "
                              f"max_inflight_bytes / grpc_max_message_bytes, the messages it receives at once): "
                              f"retry later, or raise max_inflight_bytes or lower grpc_max_message_bytes in its "
                              f"config to allow more")
        self.streams += 1
        return Arrival(stream=True)

    def _refusal_to_log(self) -> None:
        """The operator's side of a refused stream (a load generator may not show its clients'
        errors), with how to allow more: at once, then at most once every REFUSAL_LOG_S, those
        refused meanwhile said when that time is up (a line said "1 refused so far" while a
        burst refused 8 and nothing more was said), or at `close()`."""
        self._unlogged += 1
        if self._logged_at is None:
            self._say_refused()
        elif self._unlogged == 1:  # the first one held back: its line comes when the time is up
            wait = self._logged_at + REFUSAL_LOG_S - time.monotonic()
            asyncio.get_running_loop().call_later(max(0.0, wait), self._say_refused)

    def close(self) -> None:
        """The server stops: the refused streams held back are said now. Idempotent."""
        self._say_refused()

    def _say_refused(self) -> None:
        if not self._unlogged:
            return  # (said by close() before the scheduled line came)
        now = time.monotonic()
        log.warning("gRPC ModelStreamInfer refused %d stream(s)%s: %d streams were open, as many as allowed (half of "
                    "max_inflight_bytes / grpc_max_message_bytes = %d messages received at once); %d refused in "
                    "all (aclserve_grpc_streams_refused_total). Lower grpc_max_message_bytes or raise "
                    "max_inflight_bytes to allow more streams", self._unlogged,
                    "" if self._logged_at is None else f" in the last {now - self._logged_at:.0f} s",
                    self.stream_slots, self.slots, self.streams_refused)
        self._unlogged, self._logged_at = 0, now

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
