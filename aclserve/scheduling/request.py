"""One request's life inside the scheduler, and the result handed back to the server."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Mapping

import numpy as np

# Where a request is. Transitions only go forward: QUEUED -> DISPATCHED -> (future done),
# or QUEUED -> REMOVED (timed out, cancelled, shut down).
QUEUED, DISPATCHED, REMOVED = 0, 1, 2


class QueuedRequest:
    """Owned by the PriorityQueue while QUEUED, by the batcher once DISPATCHED.

    `future` is the asyncio future the client awaits; whoever resolves it checks `done()`
    first, so a request is never answered twice. Identity-hashed: it is its own queue key."""

    __slots__ = ("inputs", "rows", "level", "enqueued", "enqueued_ns", "waited_ns", "deadline_ns", "timer",
                 "future", "state", "delayed", "outcome", "trace", "answered")

    def __init__(self, inputs: Mapping[str, np.ndarray], rows: int, level: int,
                 enqueued: float, future: asyncio.Future, enqueued_ns: int = 0, trace=None):
        self.inputs = inputs
        self.rows = rows
        self.level = level
        self.enqueued = enqueued  # scheduling clock seconds (the deadline's timer, batch window)
        self.enqueued_ns = enqueued_ns  # duration clock (Clock.now_ns): statistics, the deadline
        self.waited_ns = 0  # what it waited for a decode thread before: its deadline counts it too
        self.deadline_ns = 0  # duration clock (the timeout message's); 0 = none
        self.timer = None  # deadline timer handle while queued
        self.future = future
        self.state = QUEUED
        self.delayed = False  # deadline passed under the `delay` action
        self.outcome = None  # result or exception held back by preserve_ordering
        self.trace = trace  # trace.RequestTrace of a sampled request, else None
        # its run's figures for the statistics (queue, success, h2d, infer, d2h ns), counted
        # when its outcome reaches its future (Delivery)
        self.answered: tuple[int, int, int, int, int] | None = None


@dataclass(frozen=True)
class InferenceResult:
    """The outputs of one request (its own rows only) and where its time went."""

    outputs: dict[str, np.ndarray]
    queue_ns: int  # enqueue -> its run's launch on an instance (a trace's COMPUTE_START; formed batches wait too)
    compute_ns: int  # that launch -> the run's result on the event loop
    gear: int | None  # compiled batch size of the run; None for a static model
    batch_rows: int  # real rows in that run (gear - batch_rows were padding)
    batch_requests: int  # requests in that run
    instance: str = ""
    version: str | None = None  # the version that ran it, when a reload handed it to another one


def mark_answered(cancelled: BaseException) -> None:
    """Mark the cancellation of an infer whose outputs had reached it before its task resumed
    (its client went in that moment), or while its answer was written (server/infer_pipeline.py): the
    statistics counted it a success, and so should the server's own counters
    (answered_before_cancel), not a cancelled request as well."""
    cancelled.aclserve_answered = True


def answered_before_cancel(cancelled: BaseException) -> bool:
    return getattr(cancelled, "aclserve_answered", False)
