"""aclserve_connections, by transport: the HTTP connections the guard tracks and the gRPC ones grpc
core holds (channelz's sockets of the endpoint's server), each under its own `max_connections`
cap. The gauge counted HTTP alone while its help said "Open connections" and the cap holds gRPC
too, so a gRPC fleet filling its cap showed nothing (an independent tester's find). Nothing is
timed: the counts are waited for (hang guards), and the clock that spaces channelz's walks is held
still."""
from __future__ import annotations

import socket
import time

import grpc
import pytest
from grpc._cython import cygrpc

from aclserve.server import grpc_connections
from tests.serving import free_port, server_config, started_with_grpc

from .grpc_raw import PREFACE
from .hostile import metric

LIVE = "/inference.GRPCInferenceService/ServerLive"


@pytest.fixture(scope="module")
def both(models_dir):
    yield from started_with_grpc(server_config(models_dir, grpc_port=free_port(), keepalive_timeout_s=600,
                                               header_timeout_s=600))  # none closed under the test


def _until(url: str, transport: str, wanted: float) -> None:
    """Until the scrape (its own HTTP connection counted) shows `wanted` of `transport`."""
    give_up = time.monotonic() + 60  # a hang guard
    while metric(url, "aclserve_connections", f'transport="{transport}"') != wanted:
        assert time.monotonic() < give_up, (transport, wanted, metric(url, "aclserve_connections",
                                                                      f'transport="{transport}"'))
        time.sleep(0.02)


def test_open_connections_are_counted_by_transport(both):
    host, port = both.url.rsplit(":", 1)
    grpc_host, grpc_port = both.grpc_url.rsplit(":", 1)
    held = [socket.create_connection((host, int(port))) for _ in range(2)]  # HTTP, idle
    held += [socket.create_connection((grpc_host, int(grpc_port))) for _ in range(2)]  # gRPC, before their preface
    held[-1].sendall(PREFACE)
    channel = grpc.insecure_channel(both.grpc_url)  # and a client's, with a call answered
    try:
        channel.unary_unary(LIVE, lambda m: b"", lambda b: b)(b"", timeout=30)
        _until(both.url, "http", 3)  # (the scrape's own)
        _until(both.url, "grpc", 3)
    finally:
        channel.close()
        for sock in held:
            sock.close()
    _until(both.url, "grpc", 0)
    _until(both.url, "http", 1)


def test_scrapes_within_a_second_of_a_walk_reuse_its_figure(both, monkeypatch):
    """Each scrape walked channelz's sockets on the event loop (13-21 ms at 3,000 connections):
    now scrapes in a row make one walk and show its figure, and the first once READ_EVERY_S has
    passed walks again. Walks are counted where channelz is read (one page each here)."""
    walks, now = [], [time.monotonic() + 3600]  # past any walk before this test
    read = cygrpc.channelz_get_server_sockets
    monkeypatch.setattr(cygrpc, "channelz_get_server_sockets", lambda *page: walks.append(page) or read(*page))
    monkeypatch.setattr(grpc_connections, "monotonic", lambda: now[0])
    channel = grpc.insecure_channel(both.grpc_url)
    try:
        channel.unary_unary(LIVE, lambda m: b"", lambda b: b)(b"", timeout=30)
        shown = [_grpc_connections(both.url) for _ in range(3)]
        walked = len(walks)
        now[0] += grpc_connections.READ_EVERY_S
        shown.append(_grpc_connections(both.url))
    finally:
        channel.close()
    assert walked == 1 and len(walks) == 2 and shown == [1, 1, 1, 1]


def _grpc_connections(url: str) -> float:
    return metric(url, "aclserve_connections", 'transport="grpc"')
