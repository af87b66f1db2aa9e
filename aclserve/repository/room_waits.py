"""Loads refused for the streams and events, or the memory, other models hold on a device, tried
again when room there is given back, not on a timer.

A transient ResourceLimitError (runtime/limits.py: not BeyondTheDevice nor BesideItsOwn) names
the ledger that refused and what was asked of it. Nothing but a give-back makes room on a device
(an instance closing: an unload, a retired version, a rebuild's replaced one; a failed load's claim
undone; the DVPP decoder closing), and the ledger says each one (DeviceLedger.when_given_back, from
the thread that gives back). The loop then runs one round for that device, however many give-backs
came meanwhile: the loads waiting there, in the order they were first refused, each one that fits
what is left now beside the room promised to the loads tried before it, are tried again; the others
wait on. Each load tried is promised its room on the ledger (DeviceLedger.promise), counted as promised
until its own claim takes it, then as claimed: once, not twice (a round counted a started load's room
twice, promised and claimed, until its load ended: a load fitting the room left waited for that end),
nor not at all (two loads would be tried into the same room). A full server of 144 loads waiting
does no load work and logs nothing until something there unloads, and one unloaded model's room is
tried by as many of them as it fits, not by all 144 (t95's 2,154 lines in 120 s).

A load refused for memory (runtime/device.py NoRoom with its device: not one the device cannot spare
at all) waits on the same word: memory comes back as instances are freed, each of which gives its
streams and events back too, the device's memory figure read again first (InstanceResources.release).
What the load needs in all is not known (the refusal names the piece it failed at: one instance's
model, or its buffers, the instances before it built already), so memory is not promised: a round
tries the oldest memory wait on the device whose piece fits the figure now and whose device has more
free than when it was refused (Device.memory_back: its own failed attempt's give-back, or another
waiting load's, makes no room for it), one at a time, the next once that one's load ended (a load
tried into room it did not leave for the next one). Its fallback look tries it when its piece fits
the last figure (memory freed by another process is seen once something reads it: a load, a
/metrics refresh).

A slow fallback looks again every `fallback_s()` (the backoff's longest delays): a load that fits
the device now is tried again, beside what the device holds, not what is promised (the backstop of a
promise whose load never says its end: one tried whose retry loads nothing); one that does not waits
on (a debug line). One it tries into room promised to another makes one of the two refused again (a
claim does not look at promises), said at DEBUG: work wasted, no more. Owned by LoadFailures
(failures.py); loop thread only, but for the ledger's word, which it passes to the loop. A repository
never closed is kept alive neither by the ledgers it listened to nor by its loop (a ledger holds its
listener and promises weakly, its timers hold it weakly): the ledgers forget it once it is collected.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import weakref
from dataclasses import dataclass
from typing import Callable

from ..runtime.device import Device, NoRoom
from ..runtime.limits import BesideItsOwn, BeyondTheDevice, DeviceLedger, Need, Promise, ResourceLimitError

log = logging.getLogger(__name__)

Key = tuple[str, str, tuple]  # (name, version, file identity), as failures.py keys a failure


def waits_for_room(error: BaseException) -> bool:
    """The error is a ledger's refusal, or a refusal for memory, that other models' unloads may lift
    (room on its device)."""
    if isinstance(error, NoRoom):
        return error.device is not None
    return (isinstance(error, ResourceLimitError) and not isinstance(error, (BeyondTheDevice, BesideItsOwn))
            and error.ledger is not None and error.need is not None and error.what is not None)


def device_of(error: BaseException) -> tuple[int, str]:
    """The device a refusal (waits_for_room) waits for room on, and what it is short of there."""
    if isinstance(error, NoRoom):
        return error.device.id, "memory"
    return error.ledger.device_id, "streams or events"


@dataclass(eq=False)
class _Wait:
    ledger: DeviceLedger  # (whose word says memory given back too)
    need: Need | None  # (None: a memory wait)
    what: str | None  # the refused claim's, which its promise is kept for
    device: Device | None = None  # a memory wait's, with the bytes of the piece refused and its free figure then
    needed: int = 0
    free_then: int = 0
    fallback: asyncio.TimerHandle | None = None
    promise: Promise | None = None  # tried: the room kept for it on the ledger (not a memory wait's)

    @property
    def short_of(self) -> str:
        return "memory" if self.device is not None else "streams or events"


def _if_alive(method: weakref.WeakMethod, *args) -> None:
    """A timer's call that keeps not its object alive (a repository never closed is not kept by its loop)."""
    if (bound := method()) is not None:
        bound(*args)


class RoomWaits:
    def __init__(self, fallback_s: Callable[[], float], on_room: Callable[[Key, str], None]):
        """`on_room(key, why)` runs on the loop when the load of that file is to be tried again
        (`why`: what made room); `fallback_s()`: seconds to the next fallback look of one load."""
        self._fallback_s, self._on_room = fallback_s, on_room
        self._waiting: dict[Key, _Wait] = {}
        self._trying: dict[Key, _Wait] = {}  # tried, not ended yet: each has its room promised
        self._turns: dict[Key, int] = {}  # when each was first refused, kept over its retries
        self._counter = itertools.count()
        # ledger -> (the listener it holds weakly, the call that stops its word)
        self._listening: dict[DeviceLedger, tuple[Callable[[], None], Callable[[], None]]] = {}
        self._rounds: set[DeviceLedger] = set()  # a round due on the loop
        self._closed = False

    def wait(self, key: Key, error: ResourceLimitError | NoRoom) -> bool:
        """Wait for room on the device that refused `key`'s load (`error`: waits_for_room); returns
        whether it is its first refusal (since it last loaded or was forgotten). A load that fits by
        now (streams and events given back before its refusal reached the loop) is tried at once."""
        self.end(lambda k: k == key, keep_turn=True)
        first = key not in self._turns
        self._turns.setdefault(key, next(self._counter))
        if isinstance(error, NoRoom):  # (its free figure: the refused load's own memory back already)
            device = error.device
            wait = _Wait(device.ledger, None, None, device, error.needed, device.cached_mem_info()[0])
        else:
            wait = _Wait(error.ledger, error.need, error.what)
        self._waiting[key] = wait
        self._listen(wait.ledger)
        self._arm(key, wait)
        if wait.device is None and wait.ledger.room_for(wait.need):
            self._round_soon(wait.ledger)
        return first

    def waiting(self, key: Key) -> bool:
        return key in self._waiting

    def look_in(self, key: Key) -> float | None:
        """Seconds until the fallback look of a waiting load (None: it waits not)."""
        wait = self._waiting.get(key)
        if wait is None or wait.fallback is None:
            return None
        return max(0.0, wait.fallback.when() - asyncio.get_running_loop().time())

    def devices(self) -> dict[str, tuple[int, str]]:
        """Model -> the device its first waiting load waits for room on and what it is short of there
        ("memory", "streams or events"), in the order they were refused."""
        out: dict[str, tuple[int, str]] = {}
        for key in sorted(self._waiting, key=self._turns.__getitem__):
            wait = self._waiting[key]
            out.setdefault(key[0], (wait.ledger.device_id, wait.short_of))
        return out

    def end(self, keys: Callable[[Key], bool], keep_turn: bool = False) -> None:
        """The loads of `keys` wait no more (refused otherwise, loaded, forgotten); the room promised to one
        and not taken by its claim goes back to its device (whose word brings a round). `keep_turn`: refused
        again, it keeps its place."""
        for key in [k for k in self._waiting if keys(k)]:
            self._waiting.pop(key).fallback.cancel()
        for key in [k for k in self._trying if keys(k)]:
            wait = self._trying.pop(key)
            if wait.promise is not None:
                wait.promise.end()
            else:  # (a memory wait's load ended: the next one's turn, one at a time)
                self._round_soon(wait.ledger)
        if not keep_turn:
            self._turns = {k: turn for k, turn in self._turns.items() if not keys(k)}

    def close(self) -> None:
        """No more rounds nor looks; the ledgers' word stops, the room promised goes back."""
        self._closed = True
        for wait in self._waiting.values():
            wait.fallback.cancel()
        self._waiting.clear()
        for _, stop in self._listening.values():
            stop()
        self._listening.clear()
        for wait in self._trying.values():
            if wait.promise is not None:
                wait.promise.end()
        self._trying.clear()

    def _listen(self, ledger: DeviceLedger) -> None:
        if ledger in self._listening:
            return
        loop = asyncio.get_running_loop()

        def given_back() -> None:  # (the ledger holds it weakly: it keeps no repository alive)
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(self._round_soon, ledger)
        self._listening[ledger] = given_back, ledger.when_given_back(given_back)

    def _round_soon(self, ledger: DeviceLedger) -> None:
        """One round for `ledger` on the loop, for every give-back said before it runs."""
        if not self._closed and ledger not in self._rounds:
            self._rounds.add(ledger)
            asyncio.get_running_loop().call_soon(self._round, ledger)

    def _round(self, ledger: DeviceLedger) -> None:
        self._rounds.discard(ledger)
        if self._closed:
            return
        waiting = sorted((k for k, w in self._waiting.items() if w.ledger is ledger), key=self._turns.__getitem__)
        memory_tried = any(w.ledger is ledger and w.device is not None for w in self._trying.values())
        for key in waiting:
            wait = self._waiting[key]
            if wait.device is None and ledger.room_for(wait.need):  # (beside the room promised, this round's too)
                self._try(key, f"device {ledger.device_id} has room again")
            elif wait.device is not None and not memory_tried and wait.device.memory_back(wait.needed, wait.free_then):
                memory_tried = True
                self._try(key, f"device {ledger.device_id} has memory again")

    def _arm(self, key: Key, wait: _Wait) -> None:
        wait.fallback = asyncio.get_running_loop().call_later(self._fallback_s(), _if_alive,
                                                              weakref.WeakMethod(self._look), key)

    def _look(self, key: Key) -> None:
        """The fallback: try the load again if its device has room now; else look again later."""
        wait = self._waiting.get(key)
        if wait is None or self._closed:
            return
        if wait.device is not None and wait.device.memory_back(wait.needed, -1):  # (free_then aside: a backstop)
            self._try(key, f"device {wait.ledger.device_id} has memory now")
        elif wait.device is None and wait.ledger.fits(wait.need):
            self._try(key, f"device {wait.ledger.device_id} has room now")
        else:
            log.debug("%s: version %s still waits for room on device %d", key[0], key[1], wait.ledger.device_id)
            self._arm(key, wait)

    def _try(self, key: Key, why: str) -> None:
        wait = self._trying[key] = self._waiting.pop(key)
        wait.fallback.cancel()
        if wait.device is None:
            wait.promise = wait.ledger.promise(wait.need, wait.what)
        self._on_room(key, why)
