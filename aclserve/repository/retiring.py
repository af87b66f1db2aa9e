"""The versions out of the serving map that have not closed yet (replaced by a reload, or
unloaded), and their close carried to the end.

A version leaves the serving map in the swap (lifecycle.py) and its model's task then closes it
(drain, batcher, pool). That close must end whatever cancels the task: a load or unload call
awaits the task, and a client that went away cancelled it there, which left the version half
closed (its pool never freed, UNLOADING for good, and a load of the model refused "no version
loaded" from then on). `to_the_end` runs it out, then hands the cancellation on.

A close of the repository hurries every version still closing (`Retiring.hurry`). Loop thread
only.
"""
from __future__ import annotations

import asyncio
from typing import Awaitable

from .served import ServedVersion


class Retiring:
    """The versions closing now (an unload's, a reload's, the shutdown's)."""

    def __init__(self):
        self._versions: set[ServedVersion] = set()

    def add(self, sv: ServedVersion) -> None:
        self._versions.add(sv)

    def closed(self, sv: ServedVersion) -> None:
        self._versions.discard(sv)

    def hurry(self, deadline: float) -> None:
        """Each waits for the device no later than `deadline` (time.monotonic())."""
        for sv in self._versions:
            sv.hurry(deadline)


async def to_the_end(closing: Awaitable) -> None:
    """Await `closing` until it has ended, even when the caller is cancelled meanwhile: its
    cancellation is raised then, once `closing` is done (its failure, if it failed)."""
    closing = asyncio.ensure_future(closing)
    cancelled = False
    while not closing.done():
        try:
            await asyncio.wait([closing])  # (wait, unlike await, never cancels `closing`)
        except asyncio.CancelledError:
            cancelled = True
    closing.result()
    if cancelled:
        raise asyncio.CancelledError
