"""Holds (hold_refused_connections, off by default): how long a connection refused for want of room
is not read (connections.py holds it, the guard reads on when the hold ends).

A request refused because the server has no room (errors.Overloaded) is answered at once with
Retry-After: N, and its connection is then not read for those N seconds (`hold`). A client that
retries at once then waits in its socket instead of costing the loop another refusal (measured on
one core with tools/bench_overload.py: 1,000 such connections kept 0.91-0.93 of the model's capacity with
holds and 0.36-0.41 without); but a client that sends a new request on the refused connection
waits too, and one with a timeout shorter than N times out (an open loop at 4x capacity kept
0.60-0.62 with holds, 0.75-0.85 without). N grows with the connections held, so the refusals
answered stay near REFUSALS_PER_S whatever the number of clients (see `hold_seconds`).
"""
from __future__ import annotations

import math

# Refusals per second the hold aims for while overloaded: an HTTP refusal costs the loop
# 0.1-0.2 ms (aiohttp's request and response, the body's bytes), so about 5 % of a core.
REFUSALS_PER_S = 250
HOLD_MAX_S = 10
# aiohttp reads the rest of a refused request's body for a while (connections.BODY_LINGER_S); a hold stops
# that reading, so a refusal whose body is still arriving is held for one second.
PENDING_BODY_HOLD_S = 1


def hold_seconds(held: int, keepalive_timeout_s: float, body_pending: bool = False) -> int:
    """Retry-After (whole seconds, as HTTP writes it) for a refusal while `held` connections
    (this one included) are held: each comes back once per hold, so `held / hold` refusals a
    second. At least 1, at most HOLD_MAX_S (PENDING_BODY_HOLD_S while the refused request's
    body is still arriving), and half a second or more below the keep-alive timeout (a held
    connection is idle: the sweep would close it first); 0 when that leaves no whole second
    (no hold)."""
    cap = min(PENDING_BODY_HOLD_S if body_pending else HOLD_MAX_S, math.floor(keepalive_timeout_s - 0.5))
    if cap < 1:
        return 0
    return max(1, min(cap, math.ceil(held / REFUSALS_PER_S)))
