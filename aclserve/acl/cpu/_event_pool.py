"""A device's event resources, and which events hold them when (CANN's event limit: 1023 on the
310/310P, 65535 on the 910 class; ACLSERVE_CPU_MAX_EVENTS here).

CANN does not count events as they are made but the resources their use takes (CANN 8.0
aclrtCreateEvent: "the system applies for event resources only when the aclrtRecordEvent API is
called ... After the number of events reaches the upper limit, the system waits for resource
release"; aclrtCreateEventExWithFlag: "Event资源不受硬件限制" at creation, one with ACL_EVENT_SYNC
taking them at its records; aclrtCreateEventWithFlag: ACL_EVENT_TIME_LINE "Event数量不受限制",
ACL_EVENT_SYNC (or ACL_EVENT_EXTERNAL) "创建出来的Event数量受限"). So:

    create_event                   a resource at each record, kept until its next record has
                                   its own or it is destroyed (hicann/runtime Event::Record and
                                   TryFreeLastEventId; not at reset_event, which keeps it)
    create_event_ex_with_flag      with ACL_EVENT_SYNC: a resource at each record, back once
                                   that record and the stream waits queued for it have run
                                   (hicann/runtime: the new-mode event id freed at completion);
                                   without: none
    create_event_with_flag         with ACL_EVENT_SYNC or ACL_EVENT_EXTERNAL: one at creation,
                                   refused with 207007 when none is left, back at destroy;
                                   without: none

A record that finds none left waits for a release (first come, first served), as the device's
does (hicann/runtime Event::AllocEventIdResource loops until one is freed). On the device the
recording thread waits in aclrtRecordEvent; here the record is taken and its stream waits
(nothing queued behind it runs, the event is not complete), so that a test ends at its
synchronize's timeout (507046 / 507047) where a device would hang, instead of hanging itself.
stream_abort ends such a wait (the record then completes without a resource), as does finalize.
A destroyed event's resources go back once what holds them has run (CANN's aclrtDestroyEvent:
released when the event completes).
"""
from __future__ import annotations

import collections
import threading
import weakref

_pools: "weakref.WeakKeyDictionary[object, EventPool]" = weakref.WeakKeyDictionary()
_pools_lock = threading.Lock()


class Claim:
    """One record's request for a resource: granted at once, or later by a release."""

    __slots__ = ("pool", "granted")

    def __init__(self, pool: "EventPool"):
        self.pool = pool
        self.granted = False

    def wake_waits(self) -> None:
        """Its stream is aborted (Stream.abort): the wait looks at whether to give up."""
        self.pool.wake()


class EventPool:
    """The event resources of one device. Thread-safe; waits are rare (the pool ran out), so
    they use a Condition."""

    def __init__(self, size: int):
        self.size = self.free = size
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque[Claim] = collections.deque()  # waiting, oldest first
        self.closed = False  # finalize: every wait gives up

    def take(self) -> bool:
        """One now, or False (none free, or records wait for one: they come first)."""
        with self._cond:
            if self.free and not self._queue:
                self.free -= 1
                return True
            return False

    def claim(self) -> Claim:
        """A record's: granted now if take() would be, else queued."""
        claim = Claim(self)
        with self._cond:
            if self.free and not self._queue:
                self.free -= 1
                claim.granted = True
            else:
                self._queue.append(claim)
        return claim

    def give_back(self) -> None:
        """A resource released: to the oldest waiting claim, else free."""
        with self._cond:
            if self._queue:
                self._queue.popleft().granted = True
                self._cond.notify_all()
            else:
                self.free += 1

    def cancel(self, claim: Claim) -> None:
        """A claim no longer wanted: its resource back if it had one, else out of the queue."""
        with self._cond:
            if not claim.granted:
                self._queue.remove(claim)
                return
        self.give_back()

    def wait(self, claim: Claim, give_up) -> bool:
        """Block until `claim` is granted (True), or `give_up()` is true when woken (False,
        the claim withdrawn)."""
        with self._cond:
            while not claim.granted:
                if give_up() or self.closed:
                    self._queue.remove(claim)
                    return False
                self._cond.wait()
            return True

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """finalize: the waits end (their records complete without a resource)."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()


def pool_of(device) -> EventPool:
    """The pool of a _state.Device (a new one at each init: its pool is new too)."""
    pool = _pools.get(device)
    if pool is None:
        with _pools_lock:
            pool = _pools.get(device)
            if pool is None:
                pool = _pools[device] = EventPool(device.max_events)
    return pool


def close_all() -> None:
    with _pools_lock:
        pools = list(_pools.values())
    for pool in pools:
        pool.close()


class Holding:
    """The resources one event holds, per record (generation): each goes back once no one uses
    it (its record until it ran, the stream waits queued for that record) and it is spent (an
    ACL_EVENT_SYNC event of create_event_ex_with_flag: at once; create_event's: once a later
    record got its own, or the event is destroyed). A create_event_with_flag event's one
    resource, taken at creation (`taken`), goes back at destroy."""

    def __init__(self, pool: EventPool, kept_until_next_record: bool = False, taken: bool = False):
        self._pool = pool
        self._keep = kept_until_next_record
        self._at_record = not taken
        self._taken = taken  # the one taken at creation, until destroyed
        self._lock = threading.Lock()
        self._held: dict[int, list] = {}  # generation -> [claim, users, spent]
        self._destroyed = False

    def claim(self, generation: int) -> None:
        """A record queued (the event's lock held: generations come in order)."""
        if not self._at_record:
            return
        claim = self._pool.claim()
        with self._lock:
            self._held[generation] = [claim, 1, not self._keep or self._destroyed]

    def refused(self, generation: int) -> None:
        """The record was not queued: its claim is dropped."""
        with self._lock:
            entry = self._held.pop(generation, None)
        if entry is not None:
            self._pool.cancel(entry[0])

    def obtain(self, generation: int, stream) -> None:
        """The record's task, before it completes: wait (blocking `stream`) for its resource,
        unless the stream's abort or finalize ends the wait."""
        with self._lock:
            entry = self._held.get(generation)
        if entry is None or entry[0].granted:
            return
        stream.waiting_on = entry[0]
        try:
            got = self._pool.wait(entry[0], stream.dropping)
        finally:
            stream.waiting_on = None
        if not got:
            with self._lock:
                self._held.pop(generation, None)

    def ran(self, generation: int) -> None:
        """The record completed: create_event's earlier records' resources are spent."""
        with self._lock:
            if generation not in self._held:
                return
            if self._keep:
                for earlier, entry in self._held.items():
                    if earlier < generation:
                        entry[2] = True
            back = self._let_go(generation)
        self._give_back(back)

    def wait_begins(self, generation: int) -> None:
        with self._lock:
            entry = self._held.get(generation)
            if entry is not None:
                entry[1] += 1

    def wait_ends(self, generation: int) -> None:
        with self._lock:
            back = self._let_go(generation) if generation in self._held else []
        self._give_back(back)

    def destroyed(self) -> None:
        with self._lock:
            self._destroyed = True
            for entry in self._held.values():
                entry[2] = True
            back = [g for g, (_, users, _) in self._held.items() if users == 0]
            claims = [self._held.pop(g)[0] for g in back]
            taken, self._taken = self._taken, False
        self._give_back(claims)
        if taken:
            self._pool.give_back()

    def _let_go(self, generation: int) -> list[Claim]:
        """One user of `generation` is done; the claims now to give back (hold `_lock`)."""
        self._held[generation][1] -= 1
        done = [g for g, (_, users, spent) in self._held.items() if users == 0 and spent]
        return [self._held.pop(g)[0] for g in done]

    def _give_back(self, claims: list[Claim]) -> None:
        for claim in claims:
            if claim.granted:
                self._pool.give_back()
