"""The guard's early refusals wait for the end of the loop's round, then go out together and in
order (outbox.py); over real sockets: each answer's transport is one end of a socket pair, read at the
other end without blocking."""
import asyncio
import socket

import pytest

from aclserve.server.connections import ConnectionTracker
from aclserve.server.outbox import Outbox


_peers: list[socket.socket] = []


@pytest.fixture(autouse=True)
def close_peers():
    yield
    while _peers:
        _peers.pop().close()


async def pair():
    """(transport, the peer socket reading what it writes, non-blocking; closed after the test)."""
    ours, peer = socket.socketpair()
    peer.setblocking(False)
    _peers.append(peer)
    transport, _ = await asyncio.get_running_loop().create_connection(asyncio.Protocol, sock=ours)
    return transport, peer


def received(peer: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = peer.recv(1 << 20)
        except BlockingIOError:
            return data
        if not chunk:
            return data
        data += chunk


def test_answers_made_in_one_round_go_out_at_its_end_in_order():
    async def main():
        outbox = Outbox()
        (a, peer_a), (b, peer_b) = await pair(), await pair()
        outbox.send(a, [b"first ", b"to a"])
        outbox.send(b, [b"to b"])
        outbox.send(a, [b", then a again"])
        before = received(peer_a) + received(peer_b)
        await asyncio.sleep(0)  # the round ends
        after = received(peer_a), received(peer_b)
        a.close(), b.close()
        return before, after

    before, after = asyncio.run(main())
    assert before == b""
    assert after == (b"first to a, then a again", b"to b")


def test_an_answer_to_a_connection_closed_meanwhile_is_dropped():
    async def main():
        outbox = Outbox()
        (a, peer_a), (b, peer_b) = await pair(), await pair()
        outbox.send(a, [b"lost"])
        outbox.send(b, [b"kept"])
        a.close()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        got = received(peer_a), received(peer_b)
        b.close()
        return got

    assert asyncio.run(main()) == (b"", b"kept")


def test_a_connection_closed_by_the_tracker_gets_its_waiting_answer_first():
    async def main():
        tracker = ConnectionTracker(max_connections=8, header_timeout_s=5, keepalive_timeout_s=5)
        transport, peer = await pair()
        assert tracker.admit(transport) is not None
        tracker.outbox.send(transport, [b"HTTP/1.1 503 Service Unavailable\r\n\r\n"])
        tracker.stop_accepting(0)  # no grace for the idle connection (idle_grace.py): closed in the next round
        for _ in range(3):
            await asyncio.sleep(0)
        got = received(peer)
        tracker.close_all()
        return got, transport.is_closing()

    got, closing = asyncio.run(main())
    assert got == b"HTTP/1.1 503 Service Unavailable\r\n\r\n" and closing


def test_what_waits_for_a_connection_goes_before_anything_else_written_to_it():
    async def main():
        outbox = Outbox()
        (a, peer_a), (b, _) = await pair(), await pair()
        outbox.send(a, [b"to a"])
        outbox.flush_before(b)  # nothing waits for b: the round's batch stays together
        kept = received(peer_a)
        outbox.flush_before(a)
        a.write(b", then aiohttp's")
        got = received(peer_a)
        a.close(), b.close()
        return kept, got

    assert asyncio.run(main()) == (b"", b"to a, then aiohttp's")
