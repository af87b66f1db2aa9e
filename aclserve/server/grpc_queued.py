"""The gRPC calls grpc core has received that no handler has taken yet, so that the drain can
wait for them before grpc's own stop, which ends each of them CANCELLED.

grpc core receives a call on its own threads and keeps it until grpc.aio's accept loop, on the
event loop, asks for the next one; under load most calls in flight wait there (a client keeping
48 ModelInfer calls in flight had 31 to 47 of them waiting as SIGTERM came). grpc's stop
(grpc_server_shutdown_and_notify) ends every call still waiting with CANCELLED, "typically by the
caller" (grpc/grpc#41785), which clients' retry policies, keyed on UNAVAILABLE, do not retry.

Received: channelz's callsStarted of the endpoint's core server, counted as core creates a call,
before it queues it (grpcio's channelz reads, what grpcio-channelz serves). Taken: counted here
as grpc.aio looks up each call's handler (`dispatcher`: the endpoint's one generic handler), a
call cancelled by its client while it waited included. A call whose headers core refused (no
`:path`) is received and never taken: the difference is an upper bound, hence the drain's bound
on its wait (grpc_server.QUEUE_WAIT_S). Event-loop thread only, but `server` (at construction).
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Callable

import grpc
from grpc._cython import cygrpc

from .deadline_wait import set_by

log = logging.getLogger(__name__)

_creating = threading.Lock()  # one core server made at a time here: its channelz id is the one new


def server_ids(start: int = 0) -> set[int]:
    """The channelz ids of the core servers alive in the process, from `start` on."""
    ids: set[int] = set()
    while True:
        page = json.loads(cygrpc.channelz_get_servers(start))
        found = [int(server["ref"]["serverId"]) for server in page.get("server", ())]
        ids.update(found)
        if page.get("end", True) or not found:
            return ids
        start = max(found) + 1


def calls_received(channelz_id: int) -> int | None:
    """The calls the core server of `channelz_id` has received so far; None once it is gone."""
    try:
        server = json.loads(cygrpc.channelz_get_server(channelz_id))["server"]
        return int(server.get("data", {}).get("callsStarted", 0))
    except (AttributeError, ValueError, KeyError, TypeError):  # (gone; or a grpcio whose channelz reads differ:
        return None  # no view, so the drain does not wait for grpc's queue rather than fail)


class QueuedCalls:
    """Owned by the endpoint (grpc_server.GrpcServer), which makes its grpc.aio server through
    `server` and serves its methods through `dispatcher`."""

    def __init__(self):
        self.taken = 0
        # the core server's channelz id (its open connections: grpc_connections.py); None: no view of
        # core's queue (none is waited for)
        self.channelz_id: int | None = None
        self._took = asyncio.Event()

    def server(self, make: Callable[[], grpc.aio.Server]) -> grpc.aio.Server:
        """The server `make()` returns, its core server's channelz id found: the one id new."""
        with _creating:
            try:
                before = max(server_ids(), default=0)
            except (AttributeError, ValueError, KeyError):  # (a grpcio without these reads)
                return make()
            server = make()
            new = server_ids(before + 1)
        if len(new) == 1:
            self.channelz_id = new.pop()
        else:  # (a server made meanwhile by other code, or channelz off)
            log.debug("gRPC: the server's channelz id is not known: the drain does not wait for grpc's queue")
        return server

    def dispatcher(self, methods: dict[str, grpc.RpcMethodHandler],
                   not_found: Callable[[], None] = lambda: None,
                   screen: Callable[..., grpc.RpcMethodHandler | None] = lambda details: None
                   ) -> grpc.GenericRpcHandler:
        """The generic handler of `methods` (by full name, "/service/Method") that counts the calls
        taken: grpc.aio asks it once per call it has taken from core. `screen(details)` looks at
        each call first, and the handler it gives, if any, serves the call instead (a refusal:
        grpc_metadata.py). `not_found()` is called for a call of a method not among them (grpc
        answers it UNIMPLEMENTED: grpc_refusals.py)."""
        return _Dispatcher(methods, self._count, not_found, screen)

    def _count(self) -> None:
        self.taken += 1
        self._took.set()

    def received(self) -> int:
        """The calls core has received so far (taken or not); `taken` without a view."""
        received = None if self.channelz_id is None else calls_received(self.channelz_id)
        return self.taken if received is None else received  # (destroyed: its calls with it)

    def waiting(self) -> int:
        """The calls core holds that no handler has taken (an upper bound: module docstring)."""
        return max(0, self.received() - self.taken)

    async def none_by(self, deadline: float) -> bool:
        """Wait until core holds no call a handler has not taken, or until `deadline`
        (time.monotonic()); whether none waits. Looked at again at each call taken."""
        while self.waiting():
            self._took.clear()
            if not await set_by(self._took, deadline):
                return not self.waiting()
        return True


class _Dispatcher(grpc.GenericRpcHandler):
    def __init__(self, methods: dict[str, grpc.RpcMethodHandler], taken: Callable[[], None],
                 not_found: Callable[[], None], screen: Callable[..., grpc.RpcMethodHandler | None]):
        self._methods = methods
        self._taken = taken
        self._not_found = not_found
        self._screen = screen

    def service(self, handler_call_details) -> grpc.RpcMethodHandler | None:
        self._taken()
        handler = self._screen(handler_call_details) or self._methods.get(handler_call_details.method)
        if handler is None:
            self._not_found()
        return handler
