"""The versions out of the serving map that have not closed yet, each replaced by a reload of
its (name, version) or unloading with no successor, and their close carried to the end.

The one record of them: the swap that takes a version out (lifecycle.py), or the repository's
close, adds it; it leaves once closed, in the loop step of its `retired` (replaced) or `unloaded`
event, so a reader of ModelRepository.draining() (the server's scrape-time series: a version's
queue depth counts what the versions it replaced still hold, a version unloading is scraped
until it has closed) that keeps what a closed version counted from that event counts each
version once, draining or closed, never both nor neither.

Its model's task closes a version out (drain, batcher, pool), and that close must end whatever
cancels the task: a load or unload call awaits the task, and a client that went away cancelled
it there, which left the version half closed (its pool never freed, UNLOADING for good, and a
load of the model refused "no version loaded" from then on). `to_the_end` runs it out, then
hands the cancellation on.

A close of the repository hurries every version still closing (`Retiring.hurry`). Loop thread
only.
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, Iterator

from .served import ServedVersion


class Draining:
    """Read-only: the versions out of service not closed yet (ModelRepository.draining())."""

    def __init__(self, versions: dict[ServedVersion, bool]):
        self._versions = versions  # (Retiring's own, never copied)

    def replaced(self, name: str, version: str) -> list[ServedVersion]:
        """The versions a reload of (name, version) replaced, still draining."""
        return [sv for sv, replaced in self._versions.items() if replaced and sv.name == name and sv.version == version]

    def unloading(self) -> Iterator[tuple[str, str, ServedVersion]]:
        """(model, version, served) of each version unloading: out of service, still draining."""
        for sv, replaced in list(self._versions.items()):
            if not replaced:
                yield sv.name, sv.version, sv


class Retiring:
    """The versions out of service, closing now (an unload's, a reload's, the shutdown's); `view`
    reads them."""

    def __init__(self):
        self._versions: dict[ServedVersion, bool] = {}  # -> replaced by a reload (else unloading); in swap order
        self.view = Draining(self._versions)

    def add(self, sv: ServedVersion, replaced: bool) -> None:
        self._versions[sv] = replaced

    def closed(self, sv: ServedVersion) -> None:
        self._versions.pop(sv, None)

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
