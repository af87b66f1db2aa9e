"""The gRPC endpoint's open connections, for /metrics (`aclserve_connections{transport="grpc"}`).

grpc core holds them and caps them itself (grpc.max_allowed_incoming_connections, the endpoint's
`max_connections`: grpc_server.server_options); grpcio offers no hook on a connection. channelz
lists the sockets of a core server (what grpcio-channelz serves; grpc_queued.py finds the
endpoint's server id): one a connection core took under that cap, from its accept on in the
clear, closed ones gone. Over TLS a connection is listed once its handshake is done: one still
in its handshake holds a place of the cap unseen (as measured with grpcio 1.85). Read at scrape,
a page of PAGE sockets at a time, on the event loop: about 5 us a connection (core writes each
page as JSON holding the interpreter lock, 3 ms for 1,000; parsing it 1.2 ms), 13-21 ms at 3,000.
So a scrape within READ_EVERY_S of the last walk reuses its figure (ConnectionCount): scrapers
asking often (several Prometheus servers, a dashboard's) hold the loop that long once a second
at most, not at each of their scrapes.
"""
from __future__ import annotations

import json
from time import monotonic
from typing import Callable

from grpc._cython import cygrpc

PAGE = 1000
READ_EVERY_S = 1.0  # a scrape within this of the last walk reuses its figure


class ConnectionCount:
    """The endpoint's open connections as /metrics reads them (state.grpc_connections): walked
    (open_connections) when READ_EVERY_S or more have passed since the last walk, else the last
    walk's figure. `channelz_id()`: the endpoint's core server's (None: no view, 0 connections).
    Loop thread only."""

    def __init__(self, channelz_id: Callable[[], int | None]):
        self._channelz_id = channelz_id
        self._figure = 0
        self._walked_at: float | None = None  # monotonic() of the last walk

    def __call__(self) -> int:
        now = monotonic()
        if self._walked_at is None or now - self._walked_at >= READ_EVERY_S:
            channelz_id = self._channelz_id()
            self._figure = 0 if channelz_id is None else open_connections(channelz_id) or 0  # (None: gone)
            self._walked_at = now
        return self._figure


def open_connections(channelz_id: int) -> int | None:
    """The connections the core server of `channelz_id` holds; None when it is gone (or a grpcio
    whose channelz reads differ)."""
    count, start = 0, 0
    while True:
        try:
            page = json.loads(cygrpc.channelz_get_server_sockets(channelz_id, start, PAGE))
            found = [int(ref["socketId"]) for ref in page.get("socketRef", ())]
        except (AttributeError, ValueError, KeyError, TypeError):
            return None
        count += len(found)
        if page.get("end", True) or not found:
            return count
        start = max(found) + 1
