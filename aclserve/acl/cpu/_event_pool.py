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
What the device cannot have, a record queued that waits, must not make cleanup hang either: such
a wait gives up (the record then completes without a resource) at stream_abort, at its stream's
destroy (or its context's, or reset_device's: a closing stream runs what it holds, then its
thread is joined), at its event's destroy (the resource would go back as soon as the record ran)
and at finalize. A destroyed event's resources go back once what holds them has run (CANN's
aclrtDestroyEvent: released when the event completes).

The server records several events per batch, so the common case (a resource left, no record
waiting) is kept short: one lock, the pool's, guards its count and every Holding of its device
(they change together), taken once as a record is queued and once as it ran (and as a stream's
wait for it is queued and as that wait ends); a record granted at once has no Claim, so its task
does not look at the pool before it completes.
"""
from __future__ import annotations

import collections
import threading


class Claim:
    """A record's request for a resource when none was left: queued in its pool until a release
    grants it."""

    __slots__ = ("pool", "granted")

    def __init__(self, pool: "EventPool"):
        self.pool = pool
        self.granted = False

    def wake_waits(self) -> None:
        """Its stream is aborted or closed (Stream.abort, Stream.close): the wait looks at whether
        to give up."""
        self.pool.wake()


class EventPool:
    """The event resources of one device. Thread-safe: `lock` guards the count, the queue and
    the Holdings of the device; waits are rare (the pool ran out), so they use a Condition."""

    def __init__(self, size: int):
        self.size = self.free = size
        self.lock = threading.Lock()
        self.ready = threading.Condition(self.lock)  # a claim granted, a wait to give up (Holding.obtain)
        self.queue: collections.deque[Claim] = collections.deque()  # waiting, oldest first
        self.closed = False  # finalize: every wait gives up

    def take(self) -> bool:
        """One now, or False (none free, or records wait for one: they come first)."""
        with self.lock:
            return self.take_locked()

    def take_locked(self) -> bool:
        """take(), its caller holding `lock`."""
        if self.free and not self.queue:
            self.free -= 1
            return True
        return False

    def give_back(self) -> None:
        with self.lock:
            self.release()

    def release(self) -> None:
        """A resource back (hold `lock`): to the oldest waiting claim, else free."""
        if self.queue:
            self.queue.popleft().granted = True
            self.ready.notify_all()
        else:
            self.free += 1

    def wake(self) -> None:
        with self.lock:
            self.ready.notify_all()

    def close(self) -> None:
        """finalize: the waits end (their records complete without a resource)."""
        with self.lock:
            self.closed = True
            self.ready.notify_all()


class Holding:
    """The resources an event that takes one at each record holds, per record (generation):
    each goes back once no one uses it (its record until it ran, the stream waits queued for
    that record) and it is spent (an ACL_EVENT_SYNC event of create_event_ex_with_flag: at once;
    create_event's: once a later record ran, having got its own, or the event is destroyed).
    Its state is guarded by its pool's lock."""

    __slots__ = ("_pool", "_keep", "_users", "_latest_ran", "_destroyed")

    def __init__(self, pool: EventPool, kept_until_next_record: bool = False):
        self._pool = pool
        self._keep = kept_until_next_record
        # generation -> its users; only generations holding a resource or queued for one (a
        # generation whose wait gave up is dropped: it holds none)
        self._users: dict[int, int] = {}
        self._latest_ran = 0  # create_event's: the records before it are spent
        self._destroyed = False

    def claim(self, generation: int) -> Claim | None:
        """A record queued (the event's lock held: generations come in order): None when it got
        its resource at once, else its Claim, queued (obtain waits for it)."""
        pool = self._pool
        with pool.lock:
            self._users[generation] = 1
            if pool.take_locked():
                return None
            claim = Claim(pool)
            pool.queue.append(claim)
            return claim

    def refused(self, generation: int, claim: Claim | None) -> None:
        """The record was not queued: its resource back, or its claim out of the queue."""
        pool = self._pool
        with pool.lock:
            del self._users[generation]
            if claim is None or claim.granted:
                pool.release()
            else:
                pool.queue.remove(claim)

    def obtain(self, generation: int, claim: Claim, stream) -> None:
        """The record's task, before it completes, when its claim was queued: wait (blocking
        `stream`) until it is granted, unless the stream's abort or close, the event's destroy or
        finalize ends the wait (the record then holds none)."""
        pool = self._pool
        stream.waiting_on = claim  # (before the stream's state is read: abort() and close() wake it)
        try:
            with pool.lock:
                while not claim.granted:
                    if stream.dropping() or stream.closed or self._destroyed or pool.closed:
                        pool.queue.remove(claim)
                        del self._users[generation]
                        return
                    pool.ready.wait()
        finally:
            stream.waiting_on = None

    def ran(self, generation: int) -> None:
        """The record completed: create_event's earlier records' resources are spent."""
        with self._pool.lock:
            if self._keep and generation in self._users:
                self._latest_ran = max(self._latest_ran, generation)
                self._users[generation] -= 1
                self._release_unused()
            else:
                self._let_go(generation)

    def wait_begins(self, generation: int) -> None:
        with self._pool.lock:
            if generation in self._users:
                self._users[generation] += 1

    def wait_ends(self, generation: int) -> None:
        with self._pool.lock:
            self._let_go(generation)

    def destroyed(self) -> None:
        """Its event is destroyed: the resources no one uses back, a record's wait for one ends."""
        with self._pool.lock:
            self._destroyed = True
            self._release_unused()
            if self._pool.queue:
                self._pool.ready.notify_all()

    def _let_go(self, generation: int) -> None:
        """One user of `generation` is done (hold the pool's lock): its resource back if it was
        the last and the resource is spent. Nothing for a generation that holds none (its wait
        for one gave up)."""
        users = self._users.get(generation)
        if users is None:
            return
        if users > 1 or self._keep and not self._spent(generation):
            self._users[generation] = users - 1
        else:
            del self._users[generation]
            self._pool.release()

    def _release_unused(self) -> None:
        """Every spent resource no one uses back (hold the pool's lock)."""
        done = [g for g, users in self._users.items() if not users and self._spent(g)]
        for generation in done:
            del self._users[generation]
            self._pool.release()

    def _spent(self, generation: int) -> bool:
        return not self._keep or self._destroyed or generation < self._latest_ran


class Taken:
    """The one resource of a create_event_with_flag event with ACL_EVENT_SYNC or
    ACL_EVENT_EXTERNAL, taken as it was made (EventPool.take), back at its destroy."""

    __slots__ = ("_pool",)

    def __init__(self, pool: EventPool):
        self._pool: EventPool | None = pool

    def destroyed(self) -> None:
        # once: destroy_event and a context's destroy each call it only for an event they took
        # out of _state.events (under _state.lock)
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.give_back()
