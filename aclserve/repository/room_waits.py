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

Every try has an end, which gives back what was kept for it (its promise; a memory wait's turn, below):
its load's end, however it ends (`load_ended`: a load stopped records no failure), or, for a load no
reconcile began, the word of the reconcile that planned none (`loads_nothing`: its model a problem of
the scan now, its version no longer wanted), or its bound, `fallback_s()` after the try (a backstop:
a try no reconcile told of, said at DEBUG; one whose model's task runs, which may compile another
version for minutes, waits on: that task's end rescans it). A retry that loaded nothing kept its room promised for
good: every round after counted it, and a load fitting that room waited until its fallback look.
The two kinds of wait are two classes, each with its own looks and try (_LedgerWait, _MemoryWait).

A load refused for memory (runtime/device.py NoRoom with its device: not one the device cannot spare
at all) waits on the same word: memory comes back as instances are freed, each of which gives its
streams and events back too, the device's memory figure read again first (InstanceResources.release).
What the load needs in all is not known (the refusal names the piece it failed at: one instance's
model, or its buffers, the instances before it built already), so memory is not promised: a round
tries the oldest memory wait on the device whose piece fits the figure now and whose device has more
free than when it was refused (Device.memory_back: its own failed attempt's give-back, or another
waiting load's, makes no room for it), one at a time, the next once that one's try ended (a load
tried into room it did not leave for the next one). Its fallback look tries it when its piece fits
the last figure (memory freed by another process is seen once something reads it: a load, a
/metrics refresh).

A slow fallback looks again every `fallback_s()` (the backoff's longest delays): a load that fits
the device now is tried again, beside what the device holds, not what is promised (a backstop); one
that does not waits on (a debug line). One it tries into room promised to another makes one of the two
refused again (a claim does not look at promises), said at DEBUG: work wasted, no more. Owned by LoadFailures
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
from typing import Callable, Iterable

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


class _Wait:
    """A load waiting for room on a device, of either kind: the ledger whose word says room is given back (memory
    too), its fallback look; once tried, whether its load has begun (a reconcile started it: its end ends the try)
    and the bound of a try whose load has not."""

    short_of = ""  # what it is short of there, as devices() says it
    room = ""  # what its device has again when it is tried, as the log says it
    one_at_a_time = False  # tried one at a time on its device: the next once that one's try ended

    def __init__(self, ledger: DeviceLedger):
        self.ledger = ledger
        self.fallback: asyncio.TimerHandle | None = None
        self.bound: asyncio.TimerHandle | None = None
        self.begun = False

    def fits(self) -> bool:
        """A round's look: whether the room it waits for is there now (what is promised counted)."""
        raise NotImplementedError

    def fits_now(self) -> bool:
        """The fallback look's: whether it fits what the device holds now (a backstop: promises aside)."""
        raise NotImplementedError

    def tried(self) -> None:
        """Its load is tried again now."""

    def try_ended(self) -> bool:
        """Its try ended (its load ended, or none will run): what it kept goes back; returns whether a round is due
        for the next one (a give-back says its own)."""
        raise NotImplementedError


class _LedgerWait(_Wait):
    """Refused for streams or events: `need`, for the claim of `what`, which its try is promised on the ledger."""

    short_of, room = "streams or events", "room"

    def __init__(self, ledger: DeviceLedger, need: Need, what: str):
        super().__init__(ledger)
        self.need, self.what = need, what
        self.promise: Promise | None = None

    def fits(self) -> bool:
        return self.ledger.room_for(self.need)  # (beside the room promised, this round's too)

    def fits_now(self) -> bool:
        return self.ledger.fits(self.need)

    def tried(self) -> None:
        self.promise = self.ledger.promise(self.need, self.what)

    def try_ended(self) -> bool:
        self.promise.end()  # (not taken by its claim: the ledger says the room is back, which brings a round)
        return False


class _MemoryWait(_Wait):
    """Refused for memory: the bytes of the piece refused on `device`, and the device's free figure then (the
    refused load's own memory back already). Nothing is promised (what the load needs in all is not known)."""

    short_of = room = "memory"
    one_at_a_time = True

    def __init__(self, device: Device, needed: int):
        super().__init__(device.ledger)
        self.device, self.needed = device, needed
        self.free_then = device.cached_mem_info()[0]

    def fits(self) -> bool:
        return self.device.memory_back(self.needed, self.free_then)

    def fits_now(self) -> bool:
        return self.device.memory_back(self.needed, -1)  # (free_then aside: a backstop)

    def try_ended(self) -> bool:
        return True  # (the next one's turn)


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
        # tried, not ended yet: a streams-and-events one has its room promised, a memory one its device's turn
        self._trying: dict[Key, _Wait] = {}
        self._turns: dict[Key, int] = {}  # when each was first refused, kept over its retries
        self._counter = itertools.count()
        # ledger -> (the listener it holds weakly, the call that stops its word)
        self._listening: dict[DeviceLedger, tuple[Callable[[], None], Callable[[], None]]] = {}
        self._rounds: set[DeviceLedger] = set()  # a round due on the loop
        self._closed = False
        # whether a model's apply task runs (set by its Lifecycle): a try of a busy model waits for that task, which
        # may compile another version for minutes, and the reconcile after it, not for its bound
        self.model_busy: Callable[[str], bool] = lambda name: False

    def wait(self, key: Key, error: ResourceLimitError | NoRoom) -> bool:
        """Wait for room on the device that refused `key`'s load (`error`: waits_for_room); returns
        whether it is its first refusal (since it last loaded or was forgotten). A load that fits by
        now (streams and events given back before its refusal reached the loop) is tried at once."""
        self.end(lambda k: k == key, keep_turn=True)
        first = key not in self._turns
        self._turns.setdefault(key, next(self._counter))
        wait = (_MemoryWait(error.device, error.needed) if isinstance(error, NoRoom)
                else _LedgerWait(error.ledger, error.need, error.what))
        self._waiting[key] = wait
        self._listen(wait.ledger)
        self._arm(key, wait)
        if wait.fits():
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
            self._end_try(key)
        if not keep_turn:
            self._turns = {k: turn for k, turn in self._turns.items() if not keys(k)}

    def loading(self, keys: Iterable[Key]) -> None:
        """The loads of `keys` have begun (a reconcile started them): the try of one tried ends with its load
        (`load_ended`, however that ends and however long its compile takes), not at its bound."""
        for key in keys:
            if (wait := self._trying.get(key)) is not None:
                wait.begun = True
                wait.bound.cancel()

    def load_ended(self, key: Key) -> None:
        """The load of `key` ended, however (one stopped records no failure): its try, if it was one, ends."""
        if key in self._trying:
            self._end_try(key)

    def loads_nothing(self, keys: Callable[[Key], bool]) -> None:
        """The loads of `keys` tried and not begun will not run (a reconcile planned none: the model is a problem of
        the scan now, the version is no longer wanted): their tries end, the room kept for them goes back."""
        for key in [k for k, wait in self._trying.items() if keys(k) and not wait.begun]:
            log.debug("%s: version %s, tried again for room on device %d, is not loaded: its room goes back",
                      key[0], key[1], self._trying[key].ledger.device_id)
            self._end_try(key)

    def close(self) -> None:
        """No more rounds nor looks; the ledgers' word stops, the room promised goes back."""
        self._closed = True
        for wait in self._waiting.values():
            wait.fallback.cancel()
        self._waiting.clear()
        for _, stop in self._listening.values():
            stop()
        self._listening.clear()
        for key in list(self._trying):
            self._end_try(key)  # (closed: no round)

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
        turn_taken = any(w.ledger is ledger and w.one_at_a_time for w in self._trying.values())
        for key in waiting:
            wait = self._waiting[key]
            if not (wait.one_at_a_time and turn_taken) and wait.fits():
                turn_taken = turn_taken or wait.one_at_a_time
                self._try(key, f"device {ledger.device_id} has {wait.room} again")

    def _arm(self, key: Key, wait: _Wait) -> None:
        wait.fallback = asyncio.get_running_loop().call_later(self._fallback_s(), _if_alive,
                                                              weakref.WeakMethod(self._look), key)

    def _look(self, key: Key) -> None:
        """The fallback: try the load again if its device has room now; else look again later."""
        wait = self._waiting.get(key)
        if wait is None or self._closed:
            return
        if wait.fits_now():
            self._try(key, f"device {wait.ledger.device_id} has {wait.room} now")
        else:
            log.debug("%s: version %s still waits for room on device %d", key[0], key[1], wait.ledger.device_id)
            self._arm(key, wait)

    def _try(self, key: Key, why: str) -> None:
        wait = self._trying[key] = self._waiting.pop(key)
        wait.fallback.cancel()
        wait.tried()
        # (armed before on_room, which may end the try at once: a load forgotten meanwhile; an ended try's is
        # cancelled: it holds the key alone, not the promise, which a repository never closed drops)
        self._bound(key, wait)
        self._on_room(key, why)

    def _bound(self, key: Key, wait: _Wait) -> None:
        wait.bound = asyncio.get_running_loop().call_later(self._fallback_s(), _if_alive,
                                                           weakref.WeakMethod(self._not_begun), key)

    def _not_begun(self, key: Key) -> None:
        """The bound of a try: one whose load no reconcile has begun by now (`loading`) is taken to run never (a
        backstop: `loads_nothing` ends those a reconcile tells of); the room kept for it goes back."""
        wait = self._trying.get(key)
        if wait is None or wait.begun or self._closed:
            return
        if self.model_busy(key[0]):  # (its task's end rescans it: begun then, or told of by loads_nothing)
            self._bound(key, wait)
        else:
            log.debug("%s: version %s, tried again for room on device %d, has not begun to load: its room goes "
                      "back", key[0], key[1], wait.ledger.device_id)
            self._end_try(key)

    def _end_try(self, key: Key) -> None:
        wait = self._trying.pop(key)
        wait.bound.cancel()
        if wait.try_ended():
            self._round_soon(wait.ledger)
