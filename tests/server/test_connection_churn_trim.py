"""The heap closed connections leave is trimmed once the server is quiet (server/connection_churn.py).

1,500 TLS connections of one small infer each took the RSS 101 -> 158 MB for good, where a malloc_trim
gave 36 MB back: their TLS buffers were never charged to the budget, so no trim came (found by a tester,
t94)."""
from __future__ import annotations

import asyncio
import http.client
import re
import socket
import ssl

import pytest

from aclserve.server import trim
from aclserve.server.connection_churn import CHURN_TRIM_BYTES, TLS_CLOSE_BYTES, ConnectionChurn

from tests.serving import ServerThread

from .hostile import wait_for


def test_quiet_after_enough_churn_is_what_trims(monkeypatch):
    """Not at each close, not while connections keep closing or a request is under way: at the first sweep
    that finds none closed since the one before and none under way."""
    trims = []
    trimmer = trim.HeapTrimmer(min_interval_s=0)
    monkeypatch.setattr(trimmer, "freed", trims.append)  # what the trimmer is handed (it trims in a thread)
    in_flight = [0]
    churn = ConnectionChurn(trimmer, lambda: in_flight[0])
    enough = CHURN_TRIM_BYTES // TLS_CLOSE_BYTES
    churn.closed[1] += enough - 1
    assert not churn.swept(lambda: False) and trims == []  # not enough: no sweep is owed
    churn.closed[1] += 1
    assert churn.swept(lambda: False) and trims == []  # connections closed since the last sweep
    assert churn.swept(lambda: True) and trims == []  # a request under way
    in_flight[0] = 1
    assert churn.swept(lambda: False) and trims == []  # bytes charged to the budget
    in_flight[0] = 0
    assert not churn.swept(lambda: False) and trims == [enough * TLS_CLOSE_BYTES]
    assert churn.estimate() == 0 and not churn.swept(lambda: False)  # counted afresh


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_the_heap_is_trimmed_after_many_tls_connections(double_dir, make_config, authority, loop):
    if not trim.HeapTrimmer().available:
        pytest.skip("malloc_trim needs glibc")
    run = asyncio.run if loop == "asyncio" else pytest.importorskip("uvloop").run
    ca, cert, key = authority
    context = ssl.create_default_context()
    ca.configure_trust(context)
    config = make_config(double_dir, model_control_mode="none", tls_cert_file=str(cert), tls_key_file=str(key))
    with ServerThread(config, run=run) as server:
        host, port = server.url.rsplit(":", 1)
        scraper = http.client.HTTPSConnection(host, int(port), context=context, timeout=30)  # kept alive
        try:
            assert _trims(scraper) == 0  # nothing large was ever charged to the budget
            for _ in range(300):  # each with one request, like probes or clients without keep-alive
                with context.wrap_socket(socket.create_connection((host, int(port))), server_hostname=host) as tls:
                    tls.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    assert tls.recv(64).startswith(b"HTTP/1.1 200")
            asyncio.run(wait_for(lambda: _trims(scraper) >= 1, step_s=0.2))  # the sweep after a quiet one
        finally:
            scraper.close()


def _trims(scraper: http.client.HTTPSConnection) -> float:
    scraper.request("GET", "/metrics")
    text = scraper.getresponse().read().decode()
    return float(re.search(r"^aclserve_heap_trims_total (\S+)$", text, re.M).group(1))
