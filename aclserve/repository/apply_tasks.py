"""The Lifecycle's apply tasks: at most one per model (`aclserve-apply-<model>`) carries out its plan.

A plan for a model whose task runs is not started: the model is marked to be looked at again
(`again`), and the task's end asks for a rescan, which plans what is left to do. The apply task
marks its model too when what it did may change the next plan (a file refused, a version
dropped as its file changed while it loaded, a replaced file's new one to load). Loop thread only.
"""
from __future__ import annotations

import asyncio
import functools
import logging
from typing import Callable, Coroutine

log = logging.getLogger(__name__)


class ApplyTasks:
    def __init__(self, rescan_soon: Callable[[], None], task_ended: Callable[[], None]):
        self._busy: dict[str, asyncio.Task] = {}
        self._dirty: set[str] = set()
        self._rescan_soon, self._task_ended = rescan_soon, task_ended

    def start(self, name: str, apply: Callable[[], Coroutine]) -> asyncio.Task | None:
        """Run `apply()` as `name`'s task; None when one runs already (looked at `again` after it)."""
        if name in self._busy:
            self._dirty.add(name)
            return None
        task = asyncio.get_running_loop().create_task(apply(), name=f"aclserve-apply-{name}")
        self._busy[name] = task
        task.add_done_callback(functools.partial(self._finished, name))
        return task

    def again(self, name: str) -> None:
        """Rescan once `name`'s task has ended."""
        self._dirty.add(name)

    def _finished(self, name: str, task: asyncio.Task) -> None:
        if self._busy.get(name) is task:
            del self._busy[name]
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: applying changes failed", name, exc_info=task.exception())
        if name in self._dirty:
            self._dirty.discard(name)
            self._rescan_soon()
        self._task_ended()

    def busy(self, name: str) -> bool:
        return name in self._busy

    async def wait_for(self, name: str) -> bool:
        """Until no task works on `name` (cancelling the caller does not cancel the task). True
        when one it waited for was cancelled: the repository's start, cancelled at shutdown
        (shield raised its CancelledError in the caller, a load call's handler, whose connection
        then closed without an answer). A task that has ended but whose done callback
        (`_finished`) has not run yet is still in `_busy`, and awaiting it does not yield: the
        loop spun there for good, the server hung (a helper's storm of load / unload calls)."""
        cancelled = False
        while (task := self._busy.get(name)) is not None:
            if task.done():
                await asyncio.sleep(0)  # its done callback, queued already, runs first
            else:
                await asyncio.wait([task])
            cancelled = cancelled or task.cancelled()
        return cancelled

    async def wait_idle(self) -> None:
        """Until no model is being loaded, swapped or drained."""
        while self._busy:
            await asyncio.gather(*list(self._busy.values()), return_exceptions=True)
