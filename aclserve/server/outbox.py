"""The guard's early refusals, written together at the end of the event loop's round.

Writing an answer to a client asleep in epoll wakes it, and with the client on this host (the
loopback, a veth pair: a sidecar, a gateway on the same node) the writing core pays for that
wake-up; on a VM, where the wake-up is an interrupt sent between cores, it took a third of an
early refusal's CPU (perf on one core: the 503's write spent its time in sock_def_readable).
Refusals are made one by one as the loop reads each connection, so each found its client asleep
again. Here the refusals made in one round wait until the round's callbacks have run
(loop.call_soon), then go out back to back, in the order they were made: a client woken by the
first finds the others while it runs (Netty's flush consolidation, for the same reason). A
503's latency does not matter to its client; the loop's CPU does to everyone else.

Direct answers (the guard's 200s) are written at once, not here. Deferred the same way, light
JSON at 64 clients gained 34-43 % where waking the client is dear, but at 16 clients it lost
10-19 % where waking is cheap (as for clients on other hosts): answers going out after the
round, the next batch formed before their clients could send again, and batches were smaller.

Answers on one connection keep their order: whatever else the guard writes or hands to aiohttp
on a connection first flushes what waits for it (`flush_before`), and whoever closes a
connection flushes first (connections.py). Loop thread only.
"""
from __future__ import annotations

import asyncio
from collections.abc import Sequence


class Outbox:
    """Owned by the ConnectionTracker; written to by every connection's guard."""

    __slots__ = ("_pending", "_waiting", "_round")

    def __init__(self):
        self._pending: list[tuple[object, Sequence[bytes]]] = []
        self._waiting: set = set()  # the transports in _pending
        self._round: asyncio.Handle | None = None  # the round's flush, once something waits

    def send(self, transport, chunks: Sequence[bytes]) -> None:
        """Write `chunks` (a refusal: a few hundred bytes) to `transport` at the end of this
        round."""
        self._pending.append((transport, chunks))
        self._waiting.add(transport)
        if self._round is None:
            self._round = asyncio.get_running_loop().call_soon(self.flush)

    def flush_before(self, transport) -> None:
        """Something else is about to be written to `transport`: what waits for it goes first
        (with everything waiting before it)."""
        if transport in self._waiting:
            self.flush()

    def flush(self) -> None:
        """Write everything waiting, in order (a transport closed meanwhile is skipped)."""
        if self._round is not None:
            self._round.cancel()
            self._round = None
        self._waiting.clear()
        pending, self._pending = self._pending, []
        for transport, chunks in pending:
            if not transport.is_closing():
                transport.writelines(chunks)
