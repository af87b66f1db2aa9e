"""The HTTP listeners: one socket an address (listen_hosts.py), each connection handed to a
GuardedProtocol (guard.py) in front of aiohttp's own, and one close for them all."""
from __future__ import annotations

import asyncio
import errno
import os
import ssl
from typing import Callable

from .address import shown_address
from .connections import ConnectionTracker
from .dual_stack import dual_stack_listener
from .guard import GuardedProtocol


async def listen(handlers: Callable[[], asyncio.Protocol], tracker: ConnectionTracker, hosts: list[str], port: int,
                 backlog: int, tls: Callable[[], ssl.SSLContext] | None = None) -> Listeners:
    """Listen on each of `hosts` (listen_hosts.py) at `port` (for port 0, the one the first
    bind got) with aiohttp's protocol (`handlers` makes one per connection: a RequestHandler of
    the runner's server, malformed.py), each connection going through the tracker (over TLS when
    `tls` is given: the guard starts it with the context `tls()` returns as the connection comes, the
    pair served then, tls_renewal.py, and reads the decrypted bytes). The caller closes the
    listeners (before runner.cleanup(), which shuts the connections down)."""
    def protocol() -> GuardedProtocol:
        return GuardedProtocol(tracker, handlers, tls() if tls is not None else None)
    listeners = Listeners()
    try:
        for host in hosts:
            listeners.servers.append(await _listen_on(protocol, host, port, backlog))
            port = port or listeners.sockets[0].getsockname()[1]
    except BaseException:
        listeners.close()
        raise
    return listeners


class Listeners:
    """The HTTP listeners, one an address, as one asyncio.Server reads: their sockets, one close."""

    def __init__(self) -> None:
        self.servers: list[asyncio.Server] = []

    @property
    def sockets(self) -> list:
        return [sock for server in self.servers for sock in server.sockets]

    def close(self) -> None:
        for server in self.servers:
            server.close()


async def _listen_on(protocol: Callable[[], asyncio.Protocol], host: str, port: int, backlog: int) -> asyncio.Server:
    loop = asyncio.get_running_loop()
    try:
        listener = dual_stack_listener(host, port, backlog)  # `::`: IPv4 too, as gRPC there (dual_stack.py)
        if listener is None:
            return await loop.create_server(protocol, host, port, backlog=backlog, reuse_address=True)
    except OSError as e:  # said as the operator needs it (the CLI shows messages of our own as they are)
        # an errno's own text (asyncio's and uvloop's words for EADDRINUSE differ); a name lookup's
        # error (a negative errno) as it says itself
        reason = os.strerror(e.errno) if e.errno and e.errno > 0 else (e.strerror or e)
        hint = " (--port PORT moves it)" if e.errno == errno.EADDRINUSE else ""
        raise OSError(f"cannot listen on {shown_address(host, port)}: {reason}{hint}") from None
    try:
        return await loop.create_server(protocol, sock=listener, backlog=backlog)
    except BaseException:
        listener.close()
        raise
