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
- Whose turn it is: the health and readiness calls' first (PROBES: a probe waits for the next
  slot given back, at most about EVICT_AFTER_S, never behind calls queued), then one read of each
  connection in turn (a line a connection, first come first served within it), so that the calls
  one connection queues, however many, keep no other connection's out (one sent 5,000 calls that
  never sent their message: every other call, health checks included, waited 45-60 s in a line
  of them). A read that has waited WAIT_LIMIT_S is refused (NoRoomToReceive, UNAVAILABLE with a
  pushback; `waits_refused`), its call, and the HTTP/2 stream it holds, let go for others.
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
from collections import OrderedDict

from ..config.schema import GRPC_MIN_ARRIVING
from ..errors import Overloaded

log = logging.getLogger(__name__)

EVICT_AFTER_S = 1.0  # a message arriving slower than this keeps its slot only while none waits
# A read waiting this long is refused: twice EVICT_AFTER_S, as a read at the head of its line gets
# the slot of the next read evicted, which ends only once EVICT_AFTER_S is up
WAIT_LIMIT_S = 2 * EVICT_AFTER_S
# the health and readiness methods of the inference service, whose reads go first (and those of
# grpc.health.v1: grpc_health.py)
PROBES = frozenset({"ServerLive", "ServerReady", "ModelReady"})
MIN_SLOTS = GRPC_MIN_ARRIVING  # two streams and two unary reads (a config built otherwise still gets them)
REFUSAL_LOG_S = 60.0  # refused streams are logged at most this often (the metric counts them all)


class StreamsFull(Overloaded):
    """A stream refused: streams hold their half of the slots."""


class NoRoomToReceive(Overloaded):
    """A read refused: it waited WAIT_LIMIT_S for a slot."""


class Arrival:
    """One read's (or one stream's) place among the messages arriving: `end_early` is what ends
    its read when it is evicted (its deadline moved to now); `source`, its connection (the
    call's peer address), whose line it waits in; `probe`, a health or readiness call's."""

    __slots__ = ("stream", "probe", "source", "end_early", "since", "evicted", "waiter")

    def __init__(self, stream: bool = False, probe: bool = False, source: str = ""):
        self.stream = stream
        self.probe = probe
        self.source = source
        self.end_early = None
        self.since = 0.0
        self.evicted = False
        self.waiter: asyncio.Future | None = None  # while it waits


class WaitingLines:
    """Reads waiting, a line a connection: `pop` takes the first of the line whose turn it is,
    then that line goes last. Each read is in it once, and leaves it once (`pop` or `discard`)."""

    def __init__(self):
        self._lines: OrderedDict[str, OrderedDict[Arrival, None]] = OrderedDict()
        self.count = 0

    def add(self, arrival: Arrival) -> None:
        self._lines.setdefault(arrival.source, OrderedDict())[arrival] = None
        self.count += 1

    def discard(self, arrival: Arrival) -> bool:
        """Take `arrival` out of its line; whether it was in it."""
        line = self._lines.get(arrival.source)
        if line is None or arrival not in line:
            return False
        del line[arrival]
        if not line:
            del self._lines[arrival.source]
        self.count -= 1
        return True

    def pop(self) -> Arrival | None:
        source = next(iter(self._lines), None)
        if source is None:
            return None
        line = self._lines[source]
        arrival, _ = line.popitem(last=False)
        if line:
            self._lines.move_to_end(source)
        else:
            del self._lines[source]
        self.count -= 1
        return arrival


class Arrivals:
    @classmethod
    def for_config(cls, config) -> "Arrivals":
        return cls(config.max_inflight_bytes // config.grpc_max_message_bytes)

    def __init__(self, slots: int):
        self.slots = max(MIN_SLOTS, slots)
        self.stream_slots = self.slots // 2
        self.streams = 0  # streams admitted, holding a slot or waiting for one
        self.evicted = 0  # reads ended for others waiting (/metrics)
        self.waits_refused = 0  # reads refused after WAIT_LIMIT_S waiting (/metrics)
        self.streams_refused = 0
        self._unlogged = 0  # refused streams not yet said in the log
        self._logged_at: float | None = None  # (monotonic) when they last were
        self._free = self.slots
        self._holding: dict[Arrival, None] = {}  # oldest first
        self._probes = WaitingLines()  # served before
        self._others = WaitingLines()
        self._evicting = 0  # evicted reads not yet gone
        self._timer: asyncio.TimerHandle | None = None

    @property
    def holding(self) -> int:
        return len(self._holding)

    @property
    def waiting(self) -> int:
        return self._probes.count + self._others.count

    def open_stream(self, source: str = "") -> Arrival:
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
        return Arrival(stream=True, source=source)

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
        """Wait for a slot in turn (NoRoomToReceive after WAIT_LIMIT_S). `arrival` holds it until
        `leave`, whatever happens after this returns; a cancelled or refused wait holds nothing
        (but a stream stays counted until `leave`)."""
        if self._free and not self.waiting:
            self._free -= 1
            self._hold(arrival)
            return
        loop = asyncio.get_running_loop()
        arrival.waiter = loop.create_future()
        self._lines_of(arrival).add(arrival)
        refusal = loop.call_later(WAIT_LIMIT_S, self._refuse, arrival)
        self._evict_when_due()
        try:
            await arrival.waiter
        except asyncio.CancelledError:
            if arrival in self._holding:
                self._give_back(arrival)  # the slot came with the cancellation
            else:
                self._lines_of(arrival).discard(arrival)  # (unless given a slot or refused meanwhile: gone then)
            raise
        finally:
            refusal.cancel()
            arrival.waiter = None

    def _lines_of(self, arrival: Arrival) -> WaitingLines:
        return self._probes if arrival.probe else self._others

    def _refuse(self, arrival: Arrival) -> None:
        """`arrival` has waited WAIT_LIMIT_S: refused, unless its wait has ended meanwhile."""
        if self._lines_of(arrival).discard(arrival) and not arrival.waiter.done():
            self.waits_refused += 1
            arrival.waiter.set_exception(NoRoomToReceive(
                f"no room to receive the request message: it waited {WAIT_LIMIT_S:g} s while other calls' "
                f"messages held every place (at most {self.slots} messages are received at once: "
                f"max_inflight_bytes / grpc_max_message_bytes); retry later"))

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
        """`arrival`'s slot goes to the read whose turn it is (probes first), or is free."""
        del self._holding[arrival]
        if arrival.evicted:
            self._evicting -= 1
        while (following := self._probes.pop() or self._others.pop()) is not None:
            if not following.waiter.done():  # (cancelled with its task, which has not run since)
                self._hold(following)
                following.waiter.set_result(None)
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
            if self.waiting <= self._evicting:
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
