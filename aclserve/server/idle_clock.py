"""Idleness as a client sees it, for the connection tracker's sweep (connections.py).

The sweep measures how long a connection has been idle (or in its head) on the loop's clock. When
the loop did not run for a while (the process stopped by SIGSTOP or a debugger, a paused VM, a
callback that blocked the loop), that clock ran on while nothing was read: a pooled client that
sent its next request during the pause had it waiting in its socket, and the first sweep after it
(uvloop runs the timers due before it reads the sockets) closed the connection as idle under that
request, which its client saw reset (a tester, t87: 20 keep-alive connections idle 3 s, the
server stopped 20 s, each sending a request 8 s into the pause: all 20 reset, counted idle_timeout).
So a sweep that runs more than its period late takes the time it was late off every connection's
clocks (`stalled`: the clients were not read meanwhile, whatever they did), and a connection with
bytes waiting unread in its socket is not closed as idle (`unread_bytes`): the loop reads them
next, a request.
"""
from __future__ import annotations

import fcntl
import struct
import termios

_INT = struct.Struct("i")


# The least lateness taken for a pause: a loop late by a second or so again and again (bodies parsed
# on it, a slow callback) would otherwise stretch every connection's timeouts, a slowloris's with them
# (a review); a process stopped, a debugger, a paused VM are late by far more.
PAUSE_MIN_S = 2.0


def stalled(now: float, due: float, period: float, keepalive_timeout_s: float) -> float:
    """How long the loop did not run before a sweep due at `due` ran at `now`: what it was late by,
    when that is more than `period`, PAUSE_MIN_S and half the keep-alive (a busy loop is a little late
    all the time: not a pause); else 0."""
    late = now - due
    return late if late > max(period, PAUSE_MIN_S, keepalive_timeout_s / 2) else 0.0


def discount(conns, paused: float) -> None:
    """Take `paused` (stalled's) off the clocks of the tracker's connections (tracked_connection.TrackedConnection)."""
    if paused:
        for conn in conns:
            conn.since += paused
            if conn.clock is not None:  # its send deadline's (send_deadline.py): nothing was sent meanwhile
                conn.clock.since += paused


def unread_bytes(transport) -> int:
    """Bytes the client sent that wait in the socket, not read yet (FIONREAD; 0 when unknown)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        return _INT.unpack(fcntl.ioctl(sock.fileno(), termios.FIONREAD, bytes(_INT.size)))[0]
    except (OSError, ValueError):  # closed meanwhile (fileno -1)
        return 0
