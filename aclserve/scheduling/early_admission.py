"""The default level's room as the server's early refusals see it, before a request is decoded.

A request that names no priority joins the batcher's default level. Under overload the server
refuses such a request before the work of decoding it when that level is full: the connection
guard before aiohttp parses it (server/shedding.py EarlyRefusal, counting those it lets through
until they are read: unread.py), and a read request before its JSON is decoded
(shedding.refuse_undecoded, from server/infer_pipeline.py). These are the questions they ask of the
batcher, and the refusal they count as the level's.
"""
from __future__ import annotations

from ..errors import QueueFull, ServeError
from .clock import Clock
from .policy import BatchingConfig
from .queue import PriorityQueue
from .stats import QUEUE_FULL, BatcherStats
from .unread import UnreadAdmissions


class EarlyAdmission:
    """DynamicBatcher's methods for the early refusals (a mixin: it holds no state of its own).
    The batcher provides what is annotated below; loop thread only."""

    config: BatchingConfig
    stats: BatcherStats
    _queue: PriorityQueue | None  # None until the batcher starts
    _clock: Clock | None
    _refusal: tuple[type[ServeError], str] | None  # set once the batcher takes no more requests
    _unread: UnreadAdmissions  # let in by admit_unread(), not arrived yet

    def _default_room(self) -> int | None:
        """Room left in the level of a request naming no priority (requests, or rows where its
        bound counts rows: PriorityQueue.room); None when that level is unbounded or the batcher
        takes no requests."""
        if self._refusal is not None or self._queue is None:
            return None
        return self._queue.room(self.config.default_level)

    def default_level_bounded(self) -> bool:
        """Whether a request naming no priority can find its level full (server/shedding.py)."""
        return self._default_room() is not None

    def admit_unread(self) -> bool:
        """For a request seen before it is read (server/shedding.py) that names no priority:
        True (counted as coming, unread.py) when its level has room for it and for those let
        in so far that have not been read yet; False when it has none. The level is bounded.
        Where its bound counts rows, each is counted as one row (its rows are not known yet):
        the queue itself refuses those whose rows do not fit."""
        return self._unread.admit(self._default_room(), self._clock.now())

    def request_read(self) -> None:
        """A request's body has been read (server/infer_pipeline.py: from here to the queue or its
        refusal nothing waits, but for an image input's decode): it is no longer coming."""
        self._unread.arrived()

    def default_level_full(self) -> bool:
        """Whether a request naming no priority would be refused now for want of room (its
        level is bounded and full), before it is decoded (server/shedding.refuse_undecoded)."""
        return self._default_room() == 0

    def refuse_default_level(self) -> QueueFull:
        """A request that names no priority, refused before it is decoded (server/shedding.py)
        because its level has no room for it: counted as that level's refusal, and the error
        to answer it with."""
        level = self.config.default_level
        self.stats.rejected(level, QUEUE_FULL)
        return self._queue.full_error(level)
