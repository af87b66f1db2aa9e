"""Waiting on the event loop for an asyncio.Event, no later than a deadline on time.monotonic()
(the shutdown's clock: ServerState.shutdown_deadline and answers_by, the gRPC drain); and
ending a wait under a timeout_at deadline early."""
from __future__ import annotations

import asyncio
import contextlib
import time


async def set_by(event: asyncio.Event, deadline: float) -> bool:
    """Wait until `event` is set or `deadline` has passed; whether it is set."""
    if not event.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(event.wait(), max(0.0, deadline - time.monotonic()))
    return event.is_set()


def expire_now(deadline) -> None:
    """End the wait under `deadline` (asyncio's timeout_at, async-timeout's on Python 3.10,
    which says update) now."""
    (getattr(deadline, "reschedule", None) or deadline.update)(asyncio.get_running_loop().time())
