"""Model files that failed to load: why, and when a transient failure is tried again.

A failure belongs to one file (model, version, file identity). The settle gate leaves a refused
file out of the version selection, so the same bad file is not loaded again on every scan; it
is tried again when the file, its config or its labels file changes (a new identity), when the
load API asks for another try (`forget_model`), or when its retry is due (transient device
errors only; retry.py holds the backoff; a load refused for the streams and events, or the memory,
other models hold waits for room on its device instead: room_waits.py). A warm-up run that failed the same
way at SAME_FAILURES attempts in a row (retry.warm_up_failure), the first of them at least the
backoff's `max_s` before the last, is the model's failure: its retries stop there, as for a bad
file (a device fault that lasts less than that is retried still). Each file's failure is logged
once at error level, a retry's at warning level when its reason changed (as /metrics labels it:
one failing as the last one said is logged at debug level, and so is the retry after it), a load
call's again. Owned by the ModelRepository; loop thread only (but for the word that a device let
go, which a teardown thread passes to the loop, and a device's room given back: room_waits.py).

A load whose closed pool left instances on the device (abandoned by a warm-up run the device
never finished: runtime/left_on_device.py) is not retried while any is left: each attempt of a
model that hangs left one more, each holding its streams, events and memory (and on the CPU
runtime a thread running the model) until the device could not load or reload other models.
Its retry is armed once the device has let go of them all, which may be never. Nor is it loaded
by a load call while the model still holds instances its file left (`held_by`): each call left
one more. An unload forgets a model's failures and cancels their retries (`forget_model`), but
not what it holds: a load after it is refused all the same.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
import weakref
from dataclasses import dataclass
from typing import Callable

from ..runtime.left_on_device import LeftOnDevice, left_by
from .layout import ScanResult, VersionFile
from .plan import ModelPlan
from .retry import (SAME_FAILURES, RetrySchedule, is_transient, same_words, steady_reason, transient_kind,
                    warm_up_failure)
from .room_waits import RoomWaits, device_of, waits_for_room

log = logging.getLogger(__name__)

# how a reason says its retry (record), ending it: `shown` counts its seconds down
_RETRY_SAID = re.compile(r"retry (\d+) in \d+\.\d s\)$")


@dataclass(eq=False)
class _LeftByLoad:
    """What one failed load of a model's file left on the device: counted against the model until
    the device lets go of it all (a file change or an unload forgets the failure, not this)."""
    version: str
    identity: tuple
    on_device: LeftOnDevice
    retry_waits: bool = True  # the failure's retry is armed once the device lets go (no newer failure, no success)


class LoadFailures:
    def __init__(self, retry_initial_s: float, retry_max_s: float, on_retry: Callable[[str, str], None],
                 clock: Callable[[], float] = time.monotonic):
        """`on_retry(name, version)` runs on the loop when a retry is due (the failure is forgotten);
        `clock()` (seconds) times how long a warm-up has failed the same way."""
        # (name, version, identity) -> reason as /metrics labels it (retry.steady_reason): without the retry
        # plan, which is said in the message record() returns, nor the device's ids and times (a reason that
        # changed with every retry made a new /metrics series each time)
        self._reasons: dict[tuple[str, str, tuple], str] = {}
        self._retry = RetrySchedule(retry_initial_s, retry_max_s, self._due)
        self._room = RoomWaits(self._retry.longest_delay, self._room_for)  # (its fallback: the backoff's longest)
        self._on_retry = on_retry
        # (name, version, identity) -> the reason (as _reasons) its last failure logged at warning or error level
        # said ("": none since a load call); one failing as it said is logged at debug level, and joins _quiet,
        # whose retries are too
        self._said: dict[tuple[str, str, tuple], str] = {}
        self._quiet: set[tuple[str, str, tuple]] = set()
        self._first_failed: set[tuple[str, str]] = set()  # (name, version) last failed a first transient time
        self._left: dict[str, list[_LeftByLoad]] = {}  # model -> what each of its failed loads left on the device
        # (name, version, identity) -> its last warm-up failure (warm_up_failure), the attempts in a row it ended
        # so, and when the first of them failed (`clock`)
        self._in_a_row: dict[tuple[str, str, tuple], tuple[tuple, int, float]] = {}
        self._clock = clock
        self._closed = False

    def record(self, name: str, version: str, file: VersionFile, error: BaseException, serving: str = "") -> str:
        """Remember the failure of `file` (and arm its retry when transient); returns the reason.
        `serving`: what of the version serves on, the load having been a reload ("config": the
        previous config), said in the log line (a bare "not loaded" read as if nothing served)."""
        reason, transient, key = _reason(error), is_transient(error), (name, version, file.identity)
        steady = steady_reason(reason, error)
        self._first_failed.discard((name, version))
        self._stop_waiting(name, version, file.identity)
        self._room.end(lambda k: k == key, keep_turn=True)  # (it waits again below, in its turn, or not at all)
        same, for_s = self._same_again(key, error)
        # (a device fault may last a few retries: only one outlasting the backoff's longest delay is the model's)
        stopped = (transient and same >= SAME_FAILURES and for_s >= self._retry.max_s and self._retry.enabled
                   and not self._closed)
        if stopped:
            self._retry.cancel(key)  # (one a load call's attempt found armed)
            # (what its closed pool left is held against load calls all the same; no retry once it is let go)
            self._wait_for_device(key, error, retry_waits=False)
            said = _same_every_time(same, for_s)
            # (its count and seconds out: a load call failing the same way again keeps its series)
            self._reasons[key] = f"{steady} ({same_words(said)})"
            reason = f"{reason} ({said})"
        elif transient and self._retry.enabled and not self._closed:
            what = transient_kind(error)
            if self._wait_for_device(key, error):  # (the same text until the device lets go: one /metrics series)
                said = f"{what}, {_not_retried(self.held_on_device(name))}"
                self._reasons[key] = f"{steady} ({said})"
                reason = f"{reason} ({said})"
            elif waits_for_room(error):  # (not timed: nothing but an unload there makes room)
                self._room.wait(key, error)
                # (a load call for it is answered 503 each time, not only the first: it loads once room comes
                # back, which no count of its refusals makes less likely; a reviewer, r38)
                self._first_failed.add((name, version))
                self._reasons[key] = f"{steady} ({what})"
                device, short_of = device_of(error)
                on = f"device {device}" if short_of != "memory" else f"device {device} (memory)"
                reason = f"{reason} ({what}: waits for room on {on}, tried again as models there unload)"
            else:
                attempt, delay = self._retry.schedule(name, version, file.identity)
                self._reasons[key] = f"{steady} ({what})"
                reason = f"{reason} ({what}: retry {attempt} in {delay:.1f} s)"  # (_RETRY_SAID: shown counts down)
                if attempt == 1:
                    self._first_failed.add((name, version))
        else:
            self._reasons[key] = steady
        kept = f" (serving the previous {serving})" if serving else ""
        said, self._said[key] = self._said.get(key), self._reasons[key]
        if said is None:
            log.error("%s: version %s from %s not loaded%s: %s", name, version, file.path, kept, reason)
        elif stopped:
            log.error("%s: version %s not loaded%s: %s", name, version, kept, reason)
        elif transient and said == self._reasons[key]:  # (t95: 144 models past a device, 290 lines a minute)
            self._quiet.add(key)
            log.debug("%s: version %s not loaded%s, as before: %s", name, version, kept, reason)
        elif transient:
            self._quiet.discard(key)
            log.warning("%s: version %s not loaded%s: %s", name, version, kept, reason)
        return reason

    def succeeded(self, name: str, version: str) -> None:
        """The version loaded: its next failure's retry starts from the initial delay again."""
        self._retry.succeeded(name, version)
        self._room.end(lambda k: k[:2] == (name, version))
        self._quiet = {k for k in self._quiet if k[:2] != (name, version)}
        self._said.update({k: "" for k in self._said if k[:2] == (name, version)})  # (a failure after it is said)
        self._first_failed.discard((name, version))
        self._stop_waiting(name, version)
        self._in_a_row = {k: v for k, v in self._in_a_row.items() if k[:2] != (name, version)}

    def planned(self, plans: list[ModelPlan], started: list[asyncio.Task | None], only: str | None) -> None:
        """A reconcile's `plans` for `only` (None: every model; "": none) and the task each `started` (None: its
        model busy, planned again once its task ends). A load tried again for room (room_waits.py) that they
        begin ends its try with its load (`load_ended`); one of a model they judge that they do not begin will
        not run (the model a problem of the scan now, its version no longer wanted, the folder unlistable): the
        room kept for it goes back, where it stayed promised for good, counted by every round after."""
        begun = {(plan.name, version, wanted.file.identity)
                 for plan, task in zip(plans, started) if task is not None for version, wanted in plan.load.items()}
        busy = {plan.name for plan, task in zip(plans, started) if task is None}
        self._room.loading(begun)
        self._room.loads_nothing(lambda k: (only is None or k[0] == only) and k[0] not in busy and k not in begun)

    def models_busy(self, busy: Callable[[str], bool]) -> None:
        """`busy(name)`: whether the model's apply task runs (its Lifecycle's). A load tried again for room of a
        busy model waits for that task's end, which rescans it, beyond its try's bound (room_waits.py)."""
        self._room.model_busy = busy

    def load_ended(self, name: str, version: str, identity: tuple) -> None:
        """The load of that file ended, however: one stopped (an unload, its file gone) records nothing here."""
        self._room.load_ended((name, version, identity))

    def forget_model(self, name: str, cancel_retries: bool = False) -> None:
        """The load API asks for another try of every file of `name` (or unloads it: `cancel_retries`)."""
        for key in [k for k in self._reasons if k[0] == name]:
            del self._reasons[key]
        # (a load call's failure waits again, in its turn: as the backoff's count, kept; an unload's none)
        self._room.end(lambda k: k[0] == name, keep_turn=not cancel_retries)
        self._said.update({k: "" for k in self._said if k[0] == name})  # (a load call's failure is said)
        self._quiet = {k for k in self._quiet if k[0] != name}
        if cancel_retries:  # (a load call keeps the count: the same failure again is not retried)
            self._retry.cancel_model(name)
            self._first_failed = {k for k in self._first_failed if k[0] != name}
            self._in_a_row = {k: v for k, v in self._in_a_row.items() if k[0] != name}

    def held_on_device(self, name: str) -> int:
        """Instances the failed loads of `name` left on the device and it has not freed yet."""
        return sum(left.on_device.count for left in self._held_by(name))

    def held_by(self, name: str, files: dict[str, tuple]) -> int:
        """What `name` holds on the device (held_on_device) when one of its `files` (version ->
        identity, as on disk now) left some of it; else 0: a changed file or config may load."""
        held = self._held_by(name)
        left_by_a_file_on_disk = any(files.get(left.version) == left.identity for left in held)
        return sum(left.on_device.count for left in held) if left_by_a_file_on_disk else 0

    def keep_files_of(self, scan: ScanResult) -> None:
        """Forget the failures of files changed or gone since they failed; those of a model the
        scan could not read (a problem) are kept, as it cannot tell."""
        live = {(n, v, f.identity) for n, e in scan.models.items() for v, f in e.available.items()}
        self._reasons = {k: r for k, r in self._reasons.items() if k in live or k[0] in scan.problems}
        self._in_a_row = {k: v for k, v in self._in_a_row.items() if k in live or k[0] in scan.problems}
        self._room.end(lambda k: k not in live and k[0] not in scan.problems)
        self._said = {k: said for k, said in self._said.items() if k in live or k[0] in scan.problems}
        versions = {key[:2] for key in live}
        self._first_failed = {k for k in self._first_failed if k in versions or k[0] in scan.problems}

    @property
    def files(self) -> frozenset[tuple[str, str, tuple]]:
        """(name, version, identity) of every refused file, for the settle gate."""
        return frozenset(self._reasons)

    def versions(self) -> dict[tuple[str, str], str]:
        """(name, version) -> why its current file failed to load, as /metrics labels it: not when it
        is retried, nor the ids and times in the device's words (retry.steady_reason): the same failure
        keeps the same text over its retries and load calls."""
        return {(n, v): reason for (n, v, _), reason in self._reasons.items()}

    def refused_for_good(self, name: str, version: str | None = None) -> bool:
        """`name` (or its `version`) has a refused file and no retry of any is due: it is not
        served until its file, config or labels change or the load API asks again (or, for a
        load that left instances abandoned, the device lets go of them)."""
        keys = [k for k in self._reasons if k[0] == name and version in (None, k[1])]
        return bool(keys) and not any(self._retry.pending(k) or self._room.waiting(k) for k in keys)

    def first_failure(self, name: str, versions) -> bool:
        """One of `versions` of `name` failed its first load for want of something that may come
        back (its first automatic retry is armed, or was when it failed: a retry may be due
        already; or it waits for room on its device, however often refused). A version that failed
        again is not counted: a device too small for the model fails with an out-of-memory code,
        transient, for good."""
        return any((name, v) in self._first_failed for v in versions)

    def retry_due_in(self, name: str, versions) -> float | None:
        """Seconds until the soonest automatic retry of one of `versions` of `name` (a room wait's: its
        fallback look, which is at most that: room coming back tries it sooner), or None."""
        due = [self._retry.due_in(key) if not self._room.waiting(key) else self._room.look_in(key)
               for key in self._reasons if key[0] == name and key[1] in versions]
        due = [seconds for seconds in due if seconds is not None]
        return min(due) if due else None

    def shown(self, name: str, version: str | None, reason: str) -> tuple[str, float | None]:
        """`reason` (`version`'s record, as the index and a request for it show it) with its retry's
        delay counted to now, and those seconds as said (None: it names no retry; Retry-After's). Said
        once when the load failed, "retry 3 in 3.2 s" stayed so for as long as the retry waited; and a
        request naming no version was told the soonest retry of any version, not its text's version's."""
        said = _RETRY_SAID.search(reason)
        if said is None or version is None:
            return reason, None
        due = round(self.retry_due_in(name, [version]) or 0.0, 1)  # (None: due now, its load about to begin)
        return f"{reason[:said.start()]}retry {said[1]} in {due:.1f} s)", due

    def waiting_for_room(self) -> dict[str, tuple[int, str]]:
        """Model -> the device its refused load waits for room on and what it is short of there ("memory",
        "streams or events"), in the order refused."""
        return self._room.devices()

    def first_retry_pending(self) -> set[str]:
        """Models with a refused file whose first automatic retry is still to come. Only the
        first: retries may go on until the file loads (a device too small for the model fails
        with an out-of-memory code, transient, for good; they stop only for a warm-up failing the
        same way for `max_s`: record), so one that has failed again is refused."""
        return {key[0] for key in self._reasons if self._retry.first_pending(key)}

    @property
    def retries(self) -> dict[str, int]:
        """model -> automatic load retries started."""
        return self._retry.retries

    def close(self) -> None:
        """No more retries: cancels the armed ones."""
        self._closed = True
        self._retry.close()
        self._room.close()

    def _same_again(self, key: tuple[str, str, tuple], error: BaseException) -> tuple[int, float]:
        """The attempts in a row, this one included, whose warm-up failed as this one did (the
        same run, code and device's words: retry.warm_up_failure), and the seconds from the first
        of them to this one; (0, 0.0) for another failure."""
        failure = warm_up_failure(error)
        if failure is None:
            self._in_a_row.pop(key, None)
            return 0, 0.0
        now = self._clock()
        last, times, since = self._in_a_row.get(key, (None, 0, now))
        times, since = (times + 1, since) if failure == last else (1, now)
        self._in_a_row[key] = (failure, times, since)
        return times, now - since

    def _held_by(self, name: str) -> list[_LeftByLoad]:
        """What the failed loads of `name` left that the device holds yet. One freed is kept until its
        word reaches the loop (`_device_let_go`): a newer failure may still have to stop its wait."""
        kept = [left for left in self._left.pop(name, ()) if left.on_device.count or left.retry_waits]
        if kept:
            self._left[name] = kept
        return [left for left in kept if left.on_device.count]

    def _stop_waiting(self, name: str, version: str, identity: tuple | None = None) -> None:
        """The retries of `name`'s `version` (of its file of `identity`) no longer wait for the device:
        a newer failure (or a load that succeeded) has taken the place of the one that left it."""
        for left in self._left.get(name, ()):
            if left.version == version and identity in (None, left.identity):
                left.retry_waits = False

    def _wait_for_device(self, key: tuple[str, str, tuple], error: BaseException, retry_waits: bool = True) -> bool:
        """Whether the failed load left instances on the device: they are counted against the model
        (`held_by`), and its retry (unless not `retry_waits`: none is due) waits until the device has
        let go of them all (`_device_let_go`, from the thread that frees the last)."""
        on_device = left_by(error)
        if on_device is None:
            return False
        left = _LeftByLoad(key[1], key[2], on_device, retry_waits)
        loop = asyncio.get_running_loop()
        let_go = weakref.WeakMethod(self._device_let_go)  # (an instance held for good keeps no repository alive)

        def none_left() -> None:
            method = let_go()
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody to retry
                if method is not None:
                    loop.call_soon_threadsafe(method, key, left)
        if not on_device.when_none(none_left):
            return False
        self._left.setdefault(key[0], []).append(left)
        return True

    def _device_let_go(self, key: tuple[str, str, tuple], left: _LeftByLoad) -> None:
        """The device has freed every instance the failed load left: its retry is armed (the
        backoff's next delay), unless the file failed again or loaded (`retry_waits`), or was tried
        again, changed or went meanwhile (its failure forgotten: a new one stops the wait first)."""
        waits, left.retry_waits = left.retry_waits, False
        if self._closed or not waits or key not in self._reasons:
            return
        attempt, delay = self._retry.schedule(*key)
        log.warning("%s: the device has let go of the instances the failed load of version %s left; "
                    "retry %d in %.1f s", key[0], key[1], attempt, delay)

    def _due(self, name: str, version: str, identity: tuple) -> None:
        if self._closed or self._reasons.pop((name, version, identity), None) is None:
            return  # shut down, or the file changed or went away meanwhile
        log.log(logging.DEBUG if (name, version, identity) in self._quiet else logging.INFO,
                "%s: retrying the load of version %s", name, version)
        self._on_retry(name, version)

    def _room_for(self, key: tuple[str, str, tuple], why: str) -> None:
        """The load of `key`'s file waited for room on its device (room_waits.py), which has some now (`why`)."""
        if self._closed or self._reasons.pop(key, None) is None:
            self._room.end(lambda k: k == key)
            return  # (forgotten meanwhile: its wait ended then)
        self._retry.started(key[0])
        log.log(logging.DEBUG if key in self._quiet else logging.INFO, "%s: retrying the load of version %s (%s)",
                key[0], key[1], why)
        self._on_retry(key[0], key[1])


def _not_retried(left: int) -> str:
    """Why a transient failure is not retried, and how to try again, for its one-line reason."""
    return (f"not retried: its load left {left} instance(s) abandoned on the device, which still runs their work "
            "and holds their streams, events and memory; retried once the device lets go of them, or now by a "
            "change of the file or its config or a restart (a load call is refused until then)")


def _same_every_time(times: int, for_s: float) -> str:
    """Why a warm-up failure the device could have caused is no longer retried, for its reason."""
    return (f"failed the same way {times} times in a row over {for_s:.1f} s: the model's failure, not a transient "
            "device error; not retried: a change of the file or its config, or a load call, tries it again")


def _reason(error: BaseException) -> str:
    if isinstance(error, MemoryError):  # (its text is empty, or a size)
        return "out of host memory (MemoryError)"
    if isinstance(error, FileNotFoundError) and error.filename is not None:  # (a step read a file gone meanwhile)
        return f"{os.fsdecode(error.filename)}: no such file"  # (om/spec.py's words; not "[Errno 2] No such ...")
    text = str(error) or type(error).__name__
    return text.splitlines()[0] if text else type(error).__name__
