"""The gRPC endpoint's gate between the drain's start and grpc's own stop (grpc_server.py).

grpc's stop tells every connection to go (GOAWAY) and closes the port, and ends CANCELLED every
call core then holds without a handler: those queued (grpc_queued.py), and those that arrive
after it, sent before their client read the GOAWAY (grpc/grpc#41785). So the drain takes the
queued calls first, and until grpc's stop has begun nothing goes out that would have a client
send another call on the connection meanwhile: the gate is closed from the drain's start until
`open()`. While it is closed, a call whose handler starts waits, then ends UNAVAILABLE "server
is shutting down" with the pushback trailer (retried, on a new connection: to another replica),
and an answer ready (a result, a stream's next answer, a status) waits, then goes out behind the
GOAWAY. A call cancelled meanwhile (its client gone) waits no longer. Event-loop thread only.
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import Callable

from ..errors import ShuttingDown
from .grpc_status import end_call
from .open_calls import SHUTDOWN_MESSAGE


class StopGate:
    """Owned by the endpoint (grpc_server.GrpcServer); its calls pass it in grpc_live.LiveCalls.counted."""

    def __init__(self, redact: Callable[[str], str]):
        self._redact = redact
        self._open = asyncio.Event()
        self._open.set()
        self._refusal = SHUTDOWN_MESSAGE  # what a call refused at the gate is told (close())

    @property
    def closed(self) -> bool:
        """From the drain's start until open()."""
        return not self._open.is_set()

    def close(self, refusal: str = SHUTDOWN_MESSAGE) -> None:
        """The drain begins: the calls refused are told `refusal`."""
        self._open.clear()
        self._refusal = refusal

    def open(self) -> None:
        """grpc's own stop has begun: what waits goes on. Idempotent."""
        self._open.set()

    async def passed(self) -> None:
        """Wait until the gate is open."""
        await self._open.wait()

    @contextlib.asynccontextmanager
    async def passing(self, context, method: str):
        """Holds a call's handler, from its start to its status. Started while the gate is
        closed, the call is refused once it opens: UNAVAILABLE "server is shutting down" (raises
        grpc's AbortError, as context.abort does). Ended while it is closed, by an answer or an
        error (the call's status: context.abort's AbortError included), it waits for the gate to
        open. A cancelled call (its client gone) does not wait."""
        if self.closed:
            await self._open.wait()
            await end_call(context, ShuttingDown(self._refusal), method, self._redact)
        try:
            yield
        except Exception:
            await self._open.wait()
            raise
        await self._open.wait()
