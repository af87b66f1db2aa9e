"""Work that waits on a client, ended with a status when the shutdown stops waiting for it.

gRPC: grpc's own stop cancels what is left after its grace, and a cancelled call's client sees
grpc's "Cancelling all calls", not why: at the shutdown deadline the grace is about 0, so a call
whose message had not come, or a stream still open, was cut. Instead the endpoint's stop
(grpc_server.GrpcServer.stop) ends every call still at work here once the drain is over: the
handler's task is cancelled where it waits and the cancellation turns into ShuttingDown, which
the handler answers like any refusal (UNAVAILABLE, "server is shutting down"), then grpc gets a
moment to send those statuses before it cancels the rest.

HTTP: a request whose body is still arriving when the drain ends (server.app.serve) is ended
the same way (body.read_body): its handler answers 503 "server is shutting down" with
Retry-After before the connections close, where the close alone left the client with nothing.

A handler is `at_work()` only while it waits on the client or on aclserve's work (a message, a
body, a batch), never while its answer is sent: a cancellation there would hit the transport's
own code, and a status could not go out behind an answer the client does not take anyway.
"""
from __future__ import annotations

import asyncio

from ..errors import ShuttingDown

SHUTDOWN_MESSAGE = "server is shutting down"


def device_failure_message(failure: str, status: int) -> str:
    """What the shutdown's refusals say instead of SHUTDOWN_MESSAGE when a device failed as a whole
    (server/app.py): why the server stops, and that it exits with `status` to be restarted."""
    return f"server is stopping: {failure}; it exits with status {status} to be restarted"


class OpenCalls:
    """Owned by the gRPC servicer (its calls) and the server state (HTTP body reads); event-loop
    thread only. `end()` is idempotent."""

    def __init__(self):
        self._tasks: set[asyncio.Task] = set()
        self.ending = False
        self.message = SHUTDOWN_MESSAGE  # what the calls ended say (end())

    def at_work(self) -> "_AtWork":
        """A context manager for the handler's task: ShuttingDown on entry once the calls are
        ending, and in place of the cancellation `end()` makes."""
        return _AtWork(self)

    def end(self, message: str = SHUTDOWN_MESSAGE) -> int:
        """Cancel every handler at work (each ends its call with ShuttingDown(`message`)); how many."""
        self.ending, self.message = True, message
        for task in self._tasks:
            task.cancel()
        return len(self._tasks)


class _AtWork:
    __slots__ = ("calls", "task")

    def __init__(self, calls: OpenCalls):
        self.calls = calls
        self.task = None

    def __enter__(self) -> None:
        if self.calls.ending:
            raise ShuttingDown(self.calls.message)
        self.task = asyncio.current_task()
        self.calls._tasks.add(self.task)

    def __exit__(self, kind, error, tb) -> None:
        self.calls._tasks.discard(self.task)
        if kind is not None and issubclass(kind, asyncio.CancelledError) and self.calls.ending:
            uncancel = getattr(self.task, "uncancel", None)  # Python 3.11+: the task goes on
            if uncancel is not None:
                uncancel()
            raise ShuttingDown(self.calls.message) from None
