"""An HTTP infer answer stays charged to the memory budget (budget.py) until its client has
taken it, not only until it is made.

An answer its client does not read waits in the transport's write buffer, and that memory was
charged to nothing: 32 clients asking for a 64 MiB answer each and reading none of it took the
server's RSS from 496 to 2,544 MB (128 MB each through aiohttp's path) while
aclserve_request_memory_bytes read 0, bounded only by max_connections (a tester, 2026-12-06).
So once the answer is made, its request's lease moves to a charge of what the answer holds
(`answer_charge`): its bytes on the guard's direct path (direct.py), twice them on aiohttp's,
whose response keeps its body while the copy its writer handed the transport (the head joined
to it) waits there (measured on both loops: 60 and 128 MB of RSS a 64 MiB answer). The charge
goes back once the answer is written and the transport's buffer has drained below its low-water
mark (asyncio's resume_writing, 16 KiB; aiohttp's write_eof waits for that, the guard counts
it: guard.py), or when the connection goes. A client that reads nothing then holds the budget,
so others get its 503 rather than the machine's memory, and one that takes its answer too
slowly is closed (connections.py: the send deadline), which gives the charge back.
"""
from __future__ import annotations

from aiohttp import web

from .budget import Lease

DIRECT_COPIES = 1  # the guard writes its answer once; the transport holds it (or a copy, its own gone)
AIOHTTP_COPIES = 2  # aiohttp's response keeps its body while its writer's copy waits in the transport


def answer_charge(lease: Lease, nbytes: int) -> Lease:
    """A lease of its own charging exactly `nbytes` (an answer made: never refused), taken over
    from `lease`, whose other charges (the body, its decoded tensors) go back with it."""
    charge = lease.split(lease.held)
    charge.settle(nbytes)
    return charge


class ChargedResponse(web.Response):
    """aiohttp's path: an infer answer whose `charge` (a Lease, set by the handler once the
    answer is made) goes back once aiohttp has written it and the transport's buffer has drained
    (its write_eof waits for that), or writing it failed (the connection lost: the wait ends)."""

    charge: Lease | None = None

    async def prepare(self, request: web.BaseRequest):
        try:
            return await super().prepare(request)
        except BaseException:  # not written: write_eof will not come
            self._give_back()
            raise

    async def write_eof(self, data: bytes = b"") -> None:
        try:
            await super().write_eof(data)
        finally:
            self._give_back()

    def _give_back(self) -> None:
        if self.charge is not None:
            self.charge.release()
