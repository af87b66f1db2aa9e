"""Each model version's state, named here once, and the repository index built from it.

    LOADING      a version not serving yet is being compiled, opened and warmed up; the reason
                 names the step it is at (loader.py), from the start, and once that step has
                 lasted LONG_STEP_S how long so far (`compiling big.onnx for cpu, 41 s so far`)
    READY        serving; a reason says a newer file for it was refused (the old file serves on)
    UNLOADING    out of service, the reason says why (lifecycle.py names the causes): draining
                 its queued and in-flight requests, then closing
    UNAVAILABLE  not serving, with why: its load failed (the reason names the retry when one is
                 due) or it was unloaded through the API

A version without a record was never loaded or is gone; the index shows its file, if any, from
the scan. Every change goes through `VersionStates.move`, which refuses one not in TRANSITIONS
(None stands for "no record"):

    None -> LOADING -> READY -> UNLOADING -> UNAVAILABLE or None
            LOADING -> UNAVAILABLE -> LOADING (a retry or a new file) or None (its file is gone; one
                          "unloaded": its model loaded again, or its policy no longer selects it)
            LOADING -> None       loaded, but its file went or its policy dropped it meanwhile
    READY -> READY        a reload swapped in, or a newer file refused (the reason says so)
    LOADING -> LOADING    a load that was cancelled is started again
    UNAVAILABLE -> UNAVAILABLE  a version whose load failed is unloaded through the API ("unloaded")

A reload of a serving version keeps it READY throughout: the new file loads beside the old one.
Owned by the repository's Lifecycle, which makes every move; loop thread only.

A LOADING version's step begins when a move gives it a reason other than the one it shows (the
same reason said again is the same step): VersionStates alone keeps when, and the index and
`describe` count from there when they are read, no timer running. A 1.2 GB model's compile said
only `compiling big.onnx for cpu` for 55-70 s: a slow load and a hung one looked alike.
"""
from __future__ import annotations

import enum
import time
from typing import Callable, Collection

from .layout import ScanResult


class State(str, enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


TRANSITIONS: dict[State | None, frozenset[State | None]] = {
    None: frozenset({State.LOADING}),
    State.LOADING: frozenset({State.LOADING, State.READY, State.UNAVAILABLE, None}),
    State.READY: frozenset({State.READY, State.UNLOADING}),
    State.UNLOADING: frozenset({State.UNAVAILABLE, None}),
    State.UNAVAILABLE: frozenset({State.LOADING, State.UNAVAILABLE, None}),
}


# the reason of a version unloaded through the API once it has drained, its file still there (Triton's
# words: clients match them; why it was unloaded is in its UNLOADING reason and the log)
UNLOADED = "unloaded"
NOT_LOADED = "not loaded"  # on disk and selected by its version policy, without a record yet
# ... of a model held unloaded by an API unload (its old file's "unloaded" went with that file)
HELD = "not loaded: its model was unloaded through the repository API (a load call serves it)"
NOT_SELECTED = "not selected by the version policy"  # on disk, left out by its version_policy
# a version whose files are not complete yet (settle.py), by the file it waits for
WAITING_FOR_FILE = "waiting for the file to be complete"
WAITING_FOR_CONFIG = "waiting for its config file to be complete"  # (also a problem's: planner.py)
WAITING_FOR_LABELS = "waiting for its labels file to be complete"
SHUTTING_DOWN = "the server is shutting down"  # a version's UNLOADING reason then; a load stopped then says it
# a LOADING step this long (seconds) says how long so far: a user watching the index at about 1 s wonders past a few
# seconds, while most steps of a model of ordinary size end sooner and keep their exact words (clients and tests
# match them)
LONG_STEP_S = 5.0


class IllegalTransition(RuntimeError):
    """A move not in TRANSITIONS: a bug in the repository, never a user's error."""


class VersionStates:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._records: dict[tuple[str, str], tuple[State, str]] = {}  # (name, version) -> (state, reason)
        self._step_began: dict[tuple[str, str], float] = {}  # a LOADING version's current step: when (`clock`'s)
        self.clock = clock  # (a test's may run ahead: a step looks long without waiting for it)

    def get(self, name: str, version: str) -> State | None:
        record = self._records.get((name, version))
        return record[0] if record else None

    def move(self, name: str, version: str, state: State | None, reason: str = "") -> None:
        """Record `state` (None: forget the version) with `reason`; IllegalTransition if the
        current state may not go there."""
        key = (name, version)
        current = self.get(name, version)
        if state not in TRANSITIONS[current]:
            raise IllegalTransition(f"{name}:{version}: {current and current.value} -> {state and state.value}")
        if state is State.LOADING and self._records.get(key) != (state, reason):  # a new step
            self._step_began[key] = self.clock()
        elif state is not State.LOADING:
            self._step_began.pop(key, None)
        if state is None:
            del self._records[key]
        else:
            self._records[key] = (state, reason)

    def _shown(self, key: tuple[str, str]) -> tuple[str, str]:
        """(state, reason) of the record at `key` as the index and a request show it: a LOADING
        step that has lasted LONG_STEP_S says how long so far."""
        state, reason = self._records[key]
        began = self._step_began.get(key)  # (a LOADING record's only)
        lasted = 0.0 if began is None else self.clock() - began
        if lasted < LONG_STEP_S:
            return state.value, reason
        so_far = f"{int(lasted)} s so far"
        return state.value, f"{reason}, {so_far}" if reason else so_far  # (a comma: reasons may end in brackets)

    def unloaded(self, name: str, version: str, held: bool) -> None:
        """An UNLOADING version has closed: UNAVAILABLE "unloaded" when it is `held` out on
        purpose (unloaded through the API, file still there), else forgotten (gone from disk
        or out of the version policy: the scan rows tell the rest)."""
        if self.get(name, version) is not State.UNLOADING:
            return  # a replaced version: the same version serves on, READY
        if held:
            self.move(name, version, State.UNAVAILABLE, UNLOADED)
        else:
            self.move(name, version, None)

    def failures_unloaded(self, name: str) -> None:
        """`name` is unloaded through the API: its versions whose load failed are UNAVAILABLE "unloaded"."""
        for (model, version), (state, reason) in list(self._records.items()):
            if model == name and state is State.UNAVAILABLE and reason != UNLOADED:
                self.move(name, version, State.UNAVAILABLE, UNLOADED)

    def describe(self, name: str, version: str | None, scan: ScanResult, held: bool = False,
                 pending: dict[str, dict[str, str]] | None = None) -> tuple[str, str] | None:
        """(state, reason) of the version (a version the scan found and its policy selects is
        UNAVAILABLE "not loaded" until it has a record; `held`: its model is unloaded through the
        API; `pending`: as `index`'s, a selected version waiting for its files says so as the index
        does), or with version None of the model's latest record or else of what the scan knows
        (its newest waiting version's reason, when it has one); None when nothing is known."""
        waiting = (pending or {}).get(name, {})
        key = (name, version)
        if version:
            record = self._records.get(key)
            entry = scan.models.get(name)
            if record is None and entry is not None and version in entry.selected:
                # on disk and selected, not loaded yet (between an unload and a load, say, or waiting for
                # its files): the index lists it UNAVAILABLE, and so does a request for it (not "no such
                # version"); one not selected waits for nothing (the index says "not selected" too)
                return State.UNAVAILABLE.value, waiting.get(version) or (HELD if held else NOT_LOADED)
            if record is None and name in scan.problems and not any(n == name for n, _ in self._records):
                # a model known only as a problem (the index lists it: not "unknown model"); one
                # with versions recorded still has no version that is not among them
                return State.UNAVAILABLE.value, scan.problems[name]
        else:
            latest = self.latest_recorded(name)
            key = (name, latest)
            record = self._records[key] if latest is not None else None
            if record is None and (name in scan.models or name in scan.problems):
                newest = max(waiting, key=int, default=None)  # (its versions all wait: the index says so of each)
                return State.UNAVAILABLE.value, scan.problems.get(name, waiting[newest] if newest else NOT_LOADED)
        return self._shown(key) if record else None

    def latest_recorded(self, name: str) -> str | None:
        """The version of `name` recorded last: the one whose record `describe` gives when asked for no version."""
        return next((version for (model, version) in reversed(self._records) if model == name), None)

    def forget_stale(self, scan: ScanResult, refused: set[tuple[str, str]],
                     superseded: set[tuple[str, str]] = frozenset(), held: Collection[str] = frozenset()) -> None:
        """Forget UNAVAILABLE versions whose file is gone, or whose failed file is (replaced:
        the failure of the file it was stayed shown while the new one settled), or that were
        "unloaded" through the API while their model is no longer `held` (loaded again) or
        their version policy no longer selects them (they stayed "unloaded", a 503 to retry, for
        good: the scan rows say what holds now); clear the 'new file refused' reason of READY
        versions whose refused file is gone. A model the scan could not read (a problem: its
        folder unreadable, its config broken) keeps what is known of it, but for the load
        failures in `superseded` (made with a config that has changed since: the problem says
        what is wrong now)."""
        for (name, version), (state, reason) in list(self._records.items()):
            if name in scan.problems:
                if (name, version) in superseded and state in (State.UNAVAILABLE, State.READY):
                    self.move(name, version, None if state is State.UNAVAILABLE else State.READY)
                continue
            entry = scan.models.get(name)
            if state is State.UNAVAILABLE and (
                    entry is None or version not in entry.available
                    or ((name, version) not in refused if reason != UNLOADED
                        else name not in held or version not in entry.selected)):
                self.move(name, version, None)
            elif state is State.READY and reason and (name, version) not in refused:
                self.move(name, version, State.READY)

    def index(self, scan: ScanResult, pending: dict[str, dict[str, str]], held: set[str] = frozenset(),
              ready_only: bool = False, kept_unselected: dict[str, set[str]] | None = None) -> list[dict]:
        """[{"name", "version", "state", "reason"}] for every version recorded or on disk, and
        a row with an empty version for each scan problem; `pending`: name -> version -> which
        of its files is not complete yet (settle.py: said of a version its policy selects);
        `held`: models unloaded through the API; `kept_unselected`: of a problem serving on, the
        versions its old selection leaves out (Planner.kept_unselected)."""
        rows: dict[tuple[str, str], tuple[str, str]] = {}
        for name, reason in scan.problems.items():
            rows[(name, "")] = (State.UNAVAILABLE.value, reason)
        for name, versions in (kept_unselected or {}).items():
            rows.update({(name, version): (State.UNAVAILABLE.value, NOT_SELECTED) for version in versions})
        for name, entry in scan.models.items():
            waiting = pending.get(name, {})
            for version in entry.available:
                # (one its policy passes over waits for nothing: it stays not selected, where the settle
                # window of a config edit made it a 503 to retry)
                if version in waiting and version in entry.selected and (name, version) not in self._records:
                    reason = waiting[version]
                elif version in entry.selected:
                    reason = HELD if name in held else NOT_LOADED
                else:
                    reason = NOT_SELECTED
                rows[(name, version)] = (State.UNAVAILABLE.value, reason)
        rows.update({key: self._shown(key) for key in self._records})
        out = [{"name": n, "version": v, "state": s, "reason": r} for (n, v), (s, r) in rows.items()]
        out.sort(key=lambda row: (row["name"], int(row["version"]) if row["version"].isdigit() else 0))
        return [row for row in out if row["state"] == State.READY.value] if ready_only else out
