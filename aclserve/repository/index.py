"""The repository index: its rows, and in explicit and none modes its own read of the models folder.

Rows: every version loaded or on disk (status.VersionStates.index), as clients see it while a
load call runs (control_calls.py), a serving version no instance can run UNAVAILABLE, and one
serving with instances out of rotation READY with a reason that says so (runtime/rotation.py).

No watcher reads the folder in explicit and none modes, and Triton's index lists what the folder
holds when it is asked (ModelRepositoryManager::RepositoryIndex reads it on every call): a model
copied in after the start was listed only once a load call had read the folder. So the index
call reads it as a load call does (ModelRepository.index_now: the same scan in a worker thread,
under the same lock, kept as the latest, so that requests, unloads and the index agree on what
is on disk) and starts nothing. Paced: a client calling the index in a loop would have kept
a thread scanning, and parsing configs under the GIL, for good (IndexReads).
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, TypeVar

from .status import State

T = TypeVar("T")

# an index read begins no sooner than this many times the last scan's duration (at least MIN_GAP_S)
# after that scan ended: the index's reads keep the folder's scans to a fifth of the time at most
GAP_FACTOR = 4.0
MIN_GAP_S = 0.1


def index_rows(lifecycle, planner, calls, failures, ready_only: bool = False) -> list[dict]:
    """[{"name", "version", "state", "reason"}] for every version loaded or on disk, as the latest
    scan (`planner`'s) and the Lifecycle's records say; a serving version that no instance can
    run is UNAVAILABLE (pool.out_of_service), one serving with instances out of rotation READY,
    its reason saying how many (pool.rotation_note); `calls`: the ControlCalls (a load call running: a
    model it names that no listing knows yet has a row of its own, LOADING); `failures`: the
    LoadFailures (a failed load's reason says when its retry is due, counted to now)."""
    rows = lifecycle.states.index(planner.scan, planner.pending, lifecycle.held,
                                  kept_unselected=planner.kept_unselected())
    unlisted = calls.loads_running() - {row["name"] for row in rows}  # a load call may find them
    for name in unlisted:  # LOADING, a row of the model's own as a problem's (no version known yet)
        state, reason = calls.unlisted(name)
        rows.append({"name": name, "version": "", "state": state, "reason": reason})
    if unlisted:
        rows.sort(key=lambda row: row["name"])  # (stable: each model's versions stay in order)
    for row in rows:
        if row["version"]:  # (a problem's row is the model's, not a version waiting for a load)
            row["state"], row["reason"], _ = as_shown(calls, failures, row["name"], row["version"],
                                                      row["state"], row["reason"])
        served = lifecycle.serving.get(row["name"], {}).get(row["version"])
        if served is None or row["state"] != State.READY.value:
            continue
        if (down := served.pool.out_of_service()) is not None:
            row["state"], row["reason"] = State.UNAVAILABLE.value, down
        elif note := served.pool.rotation_note():  # serving on with fewer instances: said, still READY
            row["reason"] = f"{row['reason']}; {note}" if row["reason"] else note
    return [row for row in rows if row["state"] == State.READY.value] if ready_only else rows


def as_shown(calls, failures, name: str, version: str | None, state: str, reason: str
             ) -> tuple[str, str, float | None]:
    """(state, reason, seconds to its retry as the reason says them or None) of `version`'s record
    as the index and a request for the model show it: a failed load's retry counted down to now
    (`failures`: LoadFailures.shown, that version's own), LOADING while a load call runs for it
    (`calls`: ControlCalls.shown). One place for both, so the index and a request say the same."""
    reason, retry_in = failures.shown(name, version, reason)
    state, reason = calls.shown(name, state, reason)
    return state, reason, retry_in


class IndexReads:
    """The index's reads of the folder (explicit and none modes). A read begins no sooner than
    GAP_FACTOR times the last scan's duration (any scan's: a load call's too) after that scan ended,
    and not while one runs (a call arriving then needs a scan begun after it, which would follow
    at once: calls that kept arriving would have kept scans running back to back); calls
    meanwhile wait, and those waiting together share one scan (`read_folder(asked_after)` is
    ModelRepository._reconcile's, which takes a scan begun after scan `asked_after` as its own;
    `last_scan()` the number of the repository's last scan done, numbered there): every
    answer still lists the folder as read after its call arrived, and a looping client slows itself
    only. A read goes on when its caller leaves (handler cancellation): cancelled, its scan's thread
    ran on unseen, the scan lock freed and the pace not set, so a client sending calls and dropping
    them could have scans run side by side without end. Owned by the ModelRepository; loop thread only."""

    def __init__(self, clock: Callable[[], float], read_folder: Callable[[int], Awaitable],
                 last_scan: Callable[[], int], sleep: Callable[[float], Awaitable] = asyncio.sleep):
        self._clock, self._sleep = clock, sleep  # (a test's, both: no time passes)
        self._read_folder, self._last_scan = read_folder, last_scan
        self._next = float("-inf")  # (the clock's) no read begins before
        self._no_scan = asyncio.Event()  # set while no scan runs
        self._no_scan.set()
        self._reads: set[asyncio.Task] = set()
        self._closed = False

    async def read(self, asked_after: int) -> None:
        """Until the folder has been read after scan number `asked_after` (the latest begun when
        the call arrived); returns at once after close()."""
        if self._closed:
            return
        read = asyncio.ensure_future(self._paced(asked_after))
        self._reads.add(read)
        read.add_done_callback(self._reads.discard)
        await asyncio.shield(read)

    async def _paced(self, asked_after: int) -> None:
        """Reads the folder once the pace allows, unless a scan begun after the call (after scan
        `asked_after`) is done by then (read_folder then takes it)."""
        while True:
            await self._no_scan.wait()  # (a scan running sets the pace once it ends)
            wait = self._next - self._clock()
            if wait <= 0 or self._last_scan() > asked_after:
                break
            await self._sleep(wait)
        await self._read_folder(asked_after)

    async def timed(self, scan: Awaitable[T]) -> T:
        """`scan` (a scan of the folder, one at a time: under the scan lock) awaited, its duration
        setting when the next read may begin, even if it raised or was cancelled (reads wait for it)."""
        began = self._clock()
        self._no_scan.clear()
        try:
            return await scan
        finally:
            ended = self._clock()
            self._next = ended + max(MIN_GAP_S, GAP_FACTOR * (ended - began))
            self._no_scan.set()

    async def close(self) -> None:
        """Cancel the reads still running (the repository is closing)."""
        self._closed = True
        for read in self._reads:
            read.cancel()
        await asyncio.gather(*self._reads, return_exceptions=True)
