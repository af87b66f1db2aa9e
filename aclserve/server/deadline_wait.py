"""Waiting on the event loop for an asyncio.Event, no later than a deadline on time.monotonic()
(the shutdown's clock: ServerState.shutdown_deadline and answers_by, the gRPC drain)."""
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
