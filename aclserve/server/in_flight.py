"""How many of one kind of work are in flight, and a wait, no later than a deadline, until none
is: the drain's and the shutdown's (ServerState: infer requests, repository loads and unloads;
grpc_live.LiveCalls: gRPC calls live)."""
from __future__ import annotations

import asyncio
import contextlib

from .deadline_wait import set_by


class InFlight:
    """Owned by whoever counts (ServerState, grpc_live.LiveCalls); event-loop thread only. Every
    enter() is matched by one leave()."""

    __slots__ = ("count", "_none")

    def __init__(self):
        self.count = 0
        self._none = asyncio.Event()
        self._none.set()

    def enter(self) -> None:
        self.count += 1
        self._none.clear()

    def leave(self) -> None:
        self.count -= 1
        if self.count == 0:
            self._none.set()

    @contextlib.contextmanager
    def held(self):
        """In flight from entry to exit, however the block ends."""
        self.enter()
        try:
            yield
        finally:
            self.leave()

    async def none_by(self, deadline: float) -> bool:
        """Wait until none is in flight, or until `deadline` (time.monotonic()); whether none is."""
        return await set_by(self._none, deadline)
