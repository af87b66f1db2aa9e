"""The send deadline: a client must take an answer that waits in the server at a least rate.

Once the transport's write buffer goes over its high-water mark (asyncio's pause_writing, 64 KiB:
the client is not keeping up), a clock starts; from `grace_s` (body_timeout_s) on, the client
must have taken on average `min_bytes_per_s` (send_min_bytes_per_s) a second of the time past
the grace, else the connection is closed and what it had not taken dropped (connections.py).
The clock stops when the buffer drains below its low-water mark (resume_writing). So an answer
of S bytes is never cut while its client takes it at that rate, and one that is not taken at
all is cut after `grace_s`. The rule is Kestrel's MinResponseDataRate (a rate after a grace),
with a floor set in view of the memory held (answer_charge.py): a body of max_body_bytes must
arrive within body_timeout_s (64 MiB in 60 s: about 1.1 MB/s), so an answer waits the same time,
then at 1 MiB/s. Before, a connection whose client took nothing for body_timeout_s was closed,
and any progress counted: a client reading 2 KB every 30 s held a 64 MiB answer for good.
"""
from __future__ import annotations

import contextlib
import socket
import struct

_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets the connection


class SendClock:
    """One connection's clock while its writing is paused (its tracker's, loop thread only)."""

    __slots__ = ("since", "unsent", "taken")

    def __init__(self, now: float, unsent: int):
        self.since = now
        self.unsent = unsent  # the write buffer's size when last looked at
        self.taken = 0  # bytes the client took since the clock started

    def overdue(self, now: float, unsent: int, grace_s: float, min_bytes_per_s: float) -> bool:
        """Whether the client, whose write buffer now holds `unsent`, is behind the rule. A
        buffer grown between two looks had bytes added (an answer written): not counted taken."""
        if unsent < self.unsent:
            self.taken += self.unsent - unsent
        self.unsent = unsent
        late_s = now - self.since - grace_s
        return late_s > 0 and self.taken < min_bytes_per_s * late_s


def reset_on_close(transport) -> None:
    """Have `transport`'s close reset the connection (SO_LINGER 0): what the kernel still holds
    for a client too slow goes too, and the client sees at once that it was cut (a reset), not a
    stalled answer it might read for minutes more from the socket buffers."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
