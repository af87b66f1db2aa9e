"""A load's turn among those load_concurrency lets run at once (fewer where the descriptor limit
fits fewer: descriptor_shares.loads_at_once), the wait for it ended by the load's stop
(running_compiles.py: an unload through the API, its file deleted or replaced, a shutdown).

The wait was the semaphore's alone, deaf to the stop: an unload of a version waiting behind a
compile went unanswered until that compile ended (up to compile_timeout_s, an hour by default),
and the version was then loaded and warmed up anyway, only to be unloaded (found by a tester).
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator

from ..descriptor_shares import loads_at_once
from ..om.compile_process import CompileStop, CompileStopped


class Turns(asyncio.Semaphore):
    """load_concurrency's turns, as many as the descriptor limit fits at once where that is fewer
    (made at the first load: the server shares its descriptors out after the repository is built).
    `why`: what a load waiting for one says it waits for (its index reason)."""

    def __init__(self, load_concurrency: int):
        at_once = loads_at_once(load_concurrency)
        super().__init__(at_once)
        self.why = "load_concurrency" if at_once == load_concurrency else \
            f"load_concurrency {load_concurrency}; the descriptor limit (ulimit -n) fits {at_once} at once"


class TurnWaitStopped(CompileStopped):
    """The load was stopped while it waited for its turn: nothing compiled, opened or warmed up."""


@contextlib.asynccontextmanager
async def load_turn(limit: asyncio.Semaphore, stop: CompileStop) -> AsyncIterator[None]:
    """Hold one of `limit`'s turns for the block; TurnWaitStopped if `stop` comes first (no turn
    held then, the loads behind it not held back). The turns go in the order they were asked for."""
    await _take(limit, stop)
    try:
        yield
    finally:
        limit.release()


async def _take(limit: asyncio.Semaphore, stop: CompileStop) -> None:
    if stop.stopped:
        raise TurnWaitStopped("stopped before its turn (load_concurrency)")
    if not limit.locked():  # taken at once, nothing else run meanwhile: a load started next sees it taken
        await limit.acquire()  # and says it waits (taken by a task, two started together both saw it free)
        return
    loop = asyncio.get_running_loop()
    stopped = loop.create_future()

    def wake() -> None:  # (on the loop)
        if not stopped.done():
            stopped.set_result(None)

    def hear_stop() -> None:  # (in the stopping thread: the loop's mostly)
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(wake)

    taking = loop.create_task(limit.acquire())
    try:
        with stop.telling(hear_stop):
            await asyncio.wait([taking, stopped], return_when=asyncio.FIRST_COMPLETED)
        if stop.stopped:
            raise TurnWaitStopped("stopped while waiting for its turn (load_concurrency)")
    except BaseException:  # stopped, or cancelled (the close): the turn, taken or to come, goes on
        taking.cancel()  # (a wait woken but not yet run gives it back: Semaphore.acquire)
        if taking.done() and not taking.cancelled():
            limit.release()
        raise
