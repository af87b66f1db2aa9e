"""Per-device stream and event limits, and the ledger that keeps a configuration inside them.

A device has a fixed number of streams and events (CANN docs, aclrtCreateStream and
aclrtCreateEvent: acl/soc_limits.py). Past the event limit the device does not fail: a record waits for an event to
be released, which for a server means a hang. So aclserve counts what each model needs before it
loads anything (instances x (3 streams + its context's), instances x (slots x 6 events + 6 for
the trace clock)) and refuses a model that would not fit, naming the numbers; a load that compiles
an .onnx first is checked before its compile too (`check`), where what is on its way back counts as
back (a closing instance's, a retired version's: each instance's share is `hold`'s). A context holds 2
streams on the 310-class SoCs (its default one and one for internal synchronisation), 1 on the
910-class (soc_limits.context_streams): 5 streams an instance on a 310P, 4 on a 910B. The DVPP
decoder claims its context and stream here too (images/dvpp.py). Whoever waits for room on a
device (a load refused there: repository/room_waits.py) hears each share or claim given back
(`when_given_back`), as nothing else but a give-back makes room, and keeps the room it tries a load
into for that load (`promise`) until the load's own claim takes it: counted once, as promised, then
as claimed (a promise its claim never takes, the load ended or never run, is ended by its holder).
"""
from __future__ import annotations

import logging
import re
import threading
import weakref
from dataclasses import dataclass
from types import MethodType
from typing import Callable

from ..acl.soc_limits import MAX_EVENTS
from ..errors import LoadError
from .device_clock import EVENTS as CLOCK_EVENTS

log = logging.getLogger(__name__)

INSTANCE_STREAMS = 3  # h2d, compute, d2h; its context's own come on top (DeviceLedger.context_streams)
EVENTS_PER_SLOT = 6  # Slot.EVENTS
EVENTS_PER_INSTANCE = CLOCK_EVENTS  # DeviceClock's anchors: two on each of the 3 streams
# The most slots one instance can have on any documented device (its events, each slot's and the
# instance's own): the bound of a model's `slots` and of Engine.load's (more was taken, and
# refused only at the load)
MAX_SLOTS = (MAX_EVENTS - EVENTS_PER_INSTANCE) // EVENTS_PER_SLOT
# The most instances of a model, the server's (`instances`, a config.pbtxt's instance_group) and
# Engine.load's: each takes streams, and no device has more than 2,048 (a huge count was built one
# placement after another, for good, before that was checked)
MAX_INSTANCES = 1024
# set_device's default context's stream and the runtime's internal one; the Device's management
# context's come on top
DEVICE_BASE_STREAMS = 2
# how to raise the limits, said in a refusal: the server's setting (an Engine, which has none, says its own)
SERVER_REMEDY = "set device_limits if this device allows more"


class ResourceLimitError(LoadError):
    """A model's instances and slots need more streams or events than the device has left: a
    shortage, which passes as other models unload (repository/retry.py retries it). `ledger`, `need`
    and `what`: the device's ledger that refused, what was asked of it and for what (the ledger's
    refusals carry them: a load waits for room there), kept by `reworded`."""

    ledger: DeviceLedger | None = None
    need: Need | None = None
    what: str | None = None

    def reworded(self, message: str) -> ResourceLimitError:
        """The same refusal, of the same class, said as `message`."""
        error = type(self)(message)
        error.ledger, error.need, error.what = self.ledger, self.need, self.what
        return error


class BeyondTheDevice(ResourceLimitError):
    """They need more than the device has at all, holding nothing but its own: no unload makes room."""


class BesideItsOwn(ResourceLimitError):
    """They fit the device, but not beside what the model's own instances serving there hold (a reload's,
    or a new version's beside the one it replaces): no other model's unload makes room, its own does."""


# the figures in use a refusal names, which change from one attempt to the next (other models come and go)
_IN_USE = re.compile(r" \(\d+ and \d+ already in use\)")


def without_in_use(message: str) -> str:
    """A refusal's message without the streams and events in use it names: one text for one refusal
    over its retries (the /metrics label of a load failure: repository/retry.py steady_reason)."""
    return _IN_USE.sub("", message)


@dataclass(frozen=True)
class Need:
    streams: int
    events: int
    instances: int = 0  # model instances it is for (a device's count of them places the next: builder.py)


@dataclass(eq=False)
class Promise:
    """Room on a device kept for a load tried again (DeviceLedger.promise): `need`, for the claim of `what`."""
    need: Need
    what: str
    ledger: DeviceLedger
    kept: bool = True  # (False: taken by its claim, or ended)

    def end(self) -> None:
        """Its load ended (refused again, forgotten, or loaded: it took it): it counts no more."""
        self.ledger._end_promise(self)


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
        self.instances = 0  # model instances claimed or held here, of every model (the placement's count)
        # hold()'s, each with its leaving() and its owner (the model whose instance holds it)
        self._shares: dict[object, tuple[Need, Callable[[], bool], str | None]] = {}
        self._listeners: dict[object, weakref.ref] = {}  # when_given_back's, held weakly
        self._promises: list[weakref.ref[Promise]] = []  # promise()'s, held weakly

    def context_need(self, streams: int, events: int = 0) -> Need:
        """What a context of its own takes with `streams` streams and `events` events made in it."""
        return Need(self.context_streams + streams, events)

    def need(self, instances: int, slots: int) -> Need:
        """What `instances` model instances of `slots` slots each take: a context, its 3 streams and their events."""
        one = self.context_need(INSTANCE_STREAMS, slots * EVENTS_PER_SLOT + EVENTS_PER_INSTANCE)
        return Need(instances * one.streams, instances * one.events, instances)

    def claim(self, need: Need, what: str, owner: str | None = None) -> None:
        """Claim `need` for `owner` (a model: its refusal tells its own shares from others', _refusal). It
        takes the room promised for it (`promise`: the same need, for the same `what`), counted as claimed now."""
        with self._lock:
            if not self._fits(need, self.streams, self.events):
                raise self._refusal(need, what, owner)
            self.streams, self.events = self.streams + need.streams, self.events + need.events
            self.instances += need.instances
            for promise in self._kept():
                if (promise.need, promise.what) == (need, what):
                    promise.kept = False
                    break

    def promise(self, need: Need, what: str) -> Promise:
        """Keep `need` for the claim of `what`, a load tried again into the room a wait for room found
        (repository/room_waits.py): `room_for` counts it until that claim takes it or it ends (Promise.end,
        which says the room is back, as a give-back does). claim() itself does not look at promises: another
        load may take the room (the promised one is then refused, and waits again). Held weakly: a promise
        its holder dropped (a repository never closed) counts no more."""
        promise = Promise(need, what, self)
        with self._lock:
            self._promises = [weakref.ref(kept) for kept in self._kept()] + [weakref.ref(promise)]
        return promise

    def _kept(self) -> list[Promise]:
        """The promises not taken, ended nor dropped (under the lock)."""
        return [promise for ref in self._promises if (promise := ref()) is not None and promise.kept]

    def _end_promise(self, promise: Promise) -> None:
        with self._lock:
            back, promise.kept = promise.kept, False
        if back:
            self._given_back()

    def check(self, need: Need, what: str, owner: str | None = None) -> bool:
        """Before a load's long steps (an .onnx's compile): claim()'s refusal, word for word, when
        `need` does not fit even once every share on its way back is back (leaving() true: its
        instance closing, its version retired, draining); those may be back by the claim, so they
        refuse nothing here. Returns whether it fits now (False: only once they are back). Claims nothing."""
        with self._lock:
            going = [share for share, leaving, _ in self._shares.values() if leaving()]
            streams = self.streams - sum(share.streams for share in going)
            events = self.events - sum(share.events for share in going)
            if not self._fits(need, streams, events):
                raise self._refusal(need, what, owner)
            return self._fits(need, self.streams, self.events)

    def _fits(self, need: Need, streams: int, events: int) -> bool:
        return streams + need.streams <= self.max_streams and events + need.events <= self.max_events

    def _refusal(self, need: Need, what: str, owner: str | None) -> ResourceLimitError:
        """The one message of a need that does not fit (under the lock: the figures in use now), of
        the class that says what would make room: nothing (BeyondTheDevice), an unload of `owner`'s
        own serving instances (BesideItsOwn: they hold too much even with every other share given
        back), or other models' unloads (ResourceLimitError: a shortage, which passes)."""
        base = DEVICE_BASE_STREAMS + self.context_streams
        own = [share for share, leaving, of in self._shares.values() if owner is not None and of == owner
               and not leaving()]  # (a share on its way back comes back without an unload)
        if not self._fits(need, base, 0):
            kind = BeyondTheDevice
        elif not self._fits(need, base + sum(s.streams for s in own), sum(s.events for s in own)):
            kind = BesideItsOwn
        else:
            kind = ResourceLimitError
        error = kind(
            f"{what} needs {need.streams} streams and {need.events} events on device "
            f"{self.device_id}, which allows {self.max_streams} streams and {self.max_events} "
            f"events ({self.streams} and {self.events} already in use); give models fewer instances "
            f"or slots, spread them over more devices, or {self.remedy}")
        error.ledger, error.need, error.what = self, need, what
        return error

    def fits(self, need: Need) -> bool:
        """Whether claim() would take `need` now (a share on its way back counts as held until it is back)."""
        with self._lock:
            return self._fits(need, self.streams, self.events)

    def room_for(self, need: Need) -> bool:
        """Whether claim() would take `need` now beside the room promised to loads tried again (`promise`)."""
        with self._lock:
            promised = self._kept()
            return self._fits(need, self.streams + sum(p.need.streams for p in promised),
                              self.events + sum(p.need.events for p in promised))

    def when_given_back(self, callback: Callable[[], None]) -> Callable[[], None]:
        """`callback()` after each share or claim given back (`hold`'s release, `release`) and each promise
        ended untaken, from the thread that does it, no lock held: room on the device comes back then and only
        then. Held weakly (a bound method by its object): the listener keeps it alive as long as it listens, one
        dropped without the call that ends it (a repository never closed) is forgotten, not kept here for good
        with what it names. Returns the call that ends it."""
        token = object()
        told = weakref.WeakMethod(callback) if isinstance(callback, MethodType) else weakref.ref(callback)
        with self._lock:
            self._listeners = {t: ref for t, ref in self._listeners.items() if ref() is not None}
            self._listeners[token] = told
        return lambda: self._stop_telling(token)

    def _stop_telling(self, token: object) -> None:
        with self._lock:
            self._listeners.pop(token, None)

    def _given_back(self) -> None:
        with self._lock:
            self._listeners = {t: ref for t, ref in self._listeners.items() if ref() is not None}
            listeners = [callback for ref in self._listeners.values() if (callback := ref()) is not None]
        for callback in listeners:
            try:
                callback()
            except Exception:  # (a teardown or load thread gives back: it must not fail for a listener)
                log.exception("a listener of device %d's streams and events failed", self.device_id)

    def hold(self, need: Need, leaving: Callable[[], bool], owner: str | None = None) -> Callable[[], None]:
        """`need`, claimed already, as one holder's share (an instance's, of the model `owner`): `leaving()`
        says when it is on its way back (check). Returns its release, for when the holder is freed; once only."""
        token = object()  # (two instances' shares are equal Needs, not one)
        with self._lock:
            self._shares[token] = (need, leaving, owner)
        return lambda: self._give_back(token)

    def _give_back(self, token: object) -> None:
        with self._lock:
            need, _, _ = self._shares.pop(token, (Need(0, 0), None, None))
            self.streams -= need.streams
            self.events -= need.events
            self.instances -= need.instances
        if need.streams or need.events:
            self._given_back()

    def release(self, need: Need) -> None:
        with self._lock:
            self.streams -= need.streams
            self.events -= need.events
            self.instances -= need.instances
        if need.streams or need.events:
            self._given_back()
