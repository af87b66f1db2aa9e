"""The guard's answers (direct answers, early refusals), written together at the end of the event
loop's round.

Writing an answer to a client asleep in epoll wakes it, and with the client on this host (the
loopback, a veth pair: a sidecar, a gateway on the same node) the writing core pays for that
wake-up; on a VM, where the wake-up is an interrupt sent between cores, it took a third of an
early refusal's CPU (perf on one core: the 503's write spent its time in sock_def_readable).
Written one by one, between the Python work of the requests around them, each answer finds its
client asleep again. So the answers made in one round of the loop wait here until the round's
callbacks have run (loop.call_soon), then go out back to back, in the order they were made: a
client woken by the first finds the others while it runs (Netty's flush consolidation, for the
same reason).

Two answers go out at once, with everything waiting before them:
- a large one (over LARGE bytes: its copy, not the wake-up, costs; and the transport's flow
  control sees it at once, so a client that reads nothing still stops being read);
- the last of the direct answers being made (`begin` / `end`): a lone request at one client
  then waits behind nothing, not even the batcher's own bookkeeping of that round.

Answers on one connection keep their order: all of the guard's answers go through here, in
order; aiohttp answers a connection only while the guard answers nothing there (requests
forwarded to it are never followed by an answer here while one is unanswered), and the guard
flushes what waits for a connection before it hands aiohttp that connection's bytes (aiohttp
may answer at once). Whoever closes a
connection flushes first (connections.py). Loop thread only.
"""
from __future__ import annotations

import asyncio
from collections.abc import Sequence

LARGE = 64 * 1024


class Outbox:
    """Owned by the ConnectionTracker; written to by every connection's guard."""

    __slots__ = ("_pending", "_waiting", "_round", "making")

    def __init__(self):
        self._pending: list[tuple[object, Sequence[bytes]]] = []
        self._waiting: set = set()  # the transports in _pending
        self._round: asyncio.Handle | None = None  # the round's flush, once something waits
        self.making = 0  # direct answers begun and not ended

    def send(self, transport, chunks: Sequence[bytes]) -> None:
        """Write `chunks` (an early refusal) to `transport` at the end of this round, or now when
        large."""
        self._pending.append((transport, chunks))
        self._waiting.add(transport)
        if sum(map(len, chunks)) > LARGE:
            self.flush()
        elif self._round is None:
            self._round = asyncio.get_running_loop().call_soon(self.flush)

    def begin(self) -> None:
        """A direct answer is being made: until it ends, answers wait for the round's end."""
        self.making += 1

    def end(self, transport=None, chunks: Sequence[bytes] | None = None) -> None:
        """A direct answer begun ends, written with `chunks` (None: nothing to write, it was
        cancelled or its connection is gone). The last one being made flushes at once."""
        self.making -= 1
        if chunks is None:
            if self.making == 0 and self._pending:
                self.flush()
        elif self.making == 0:
            self._pending.append((transport, chunks))
            self.flush()
        else:
            self.send(transport, chunks)

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
