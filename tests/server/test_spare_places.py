"""At max_connections, every place taken by a request under way (its body still coming), a new
connection is taken over the cap for the health probes and /metrics alone (spare_places.py): GET
and HEAD of /v2/health/live, /v2/health/ready and /metrics are answered, and the answer closes the
connection; anything else gets the 503 of the cap, as every new connection did before (a tester,
t87: the probes too, so a kubelet would restart a pod for being busy), and a WARNING says that
connections are refused, once while it lasts (none did). Raw sockets on a real server; the loops
are hang guards."""
from __future__ import annotations

import contextlib
import logging
import socket
import time

import pytest

from tests.serving import ServerThread

from .hostile import metric

CAP = 2
BODY = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,16],"data":[' + b",".join([b"1.0"] * 16) + b"]}]}"
PROBES = [b"GET /v2/health/live", b"GET /v2/health/ready", b"GET /metrics", b"HEAD /v2/health/live",
          b"GET /v2/health/ready?verbose=1"]
# not probes: an infer request, the model's metadata, a path a probe's but for its last slash
OTHERS = [(b"POST /v2/models/double/infer", BODY), (b"GET /v2/models/double", b""), (b"GET /v2/health/live/", b"")]


@pytest.fixture(scope="module")
def full(models_dir, make_config):
    """A server with max_connections 2, both taken by uploads whose bodies never end."""
    with ServerThread(_config(models_dir, make_config)) as srv:
        with held(srv.url):
            for _ in range(1500):  # until both run their handlers (each body charged as its bytes come)
                if metric(srv.url, "aclserve_request_memory_bytes") >= CAP * 2:
                    break
                time.sleep(0.02)
            yield srv


def _config(models_dir, make_config):
    return make_config(models_dir, model_control_mode="none", max_connections=CAP, keepalive_timeout_s=600,
                       header_timeout_s=600, body_timeout_s=600)


@contextlib.contextmanager
def held(url: str):
    """CAP connections, each with a request under way (a body that never ends): no place gives way. Opened
    first, on a server with none open, they take the cap's places."""
    host, port = url.rsplit(":", 1)
    socks = [socket.create_connection((host, int(port)), timeout=30) for _ in range(CAP)]
    try:
        for sock in socks:
            sock.sendall(b"POST /v2/models/double/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 9\r\n\r\n{ ")
        yield
    finally:
        for sock in socks:
            sock.close()


def ask(url: str, line: bytes, body: bytes = b"") -> tuple[int, bytes, bytes]:
    """(status, head, body) of the answer to one request on a connection of its own, read until the server
    closes it (a hang guard's timeout else)."""
    host, port = url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(line + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    head, _, rest = got.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), head.lower(), rest


@pytest.mark.parametrize("line", PROBES, ids=[p.decode() for p in PROBES])
def test_probes_over_the_cap_are_answered_and_closed(full, line):
    status, head, body = ask(full.url, line)
    assert status == 200, body
    assert b"\r\nconnection: close" in head
    if line.startswith(b"HEAD"):
        assert body == b""


@pytest.mark.parametrize("line,body", OTHERS, ids=[o[0].decode() for o in OTHERS])
def test_other_requests_over_the_cap_are_refused(full, line, body):
    status, head, answer = ask(full.url, line, body)
    assert status == 503
    assert answer == b'{"error":"server has too many open connections (max_connections); retry later"}'
    assert b"\r\nretry-after: 1" in head and b"\r\nconnection: close" in head


def test_refusals_at_the_cap_are_counted_and_said_once(models_dir, make_config, caplog):
    caplog.set_level(logging.WARNING, logger="aclserve.server.spare_places")
    with ServerThread(_config(models_dir, make_config)) as srv, held(srv.url):
        statuses = [ask(srv.url, b"GET /v2/models/double")[0] for _ in range(3)]
        refused = metric(srv.url, "aclserve_connections_closed_total", 'reason="refused"')
    lines = [r.getMessage() for r in caplog.records if r.name == "aclserve.server.spare_places"]
    assert statuses == [503] * 3 and refused == 3
    assert len(lines) == 1 and "HTTP connections refused at max_connections (2 taken" in lines[0], lines
