"""Request metadata over 16 KiB (grpc_metadata.METADATA_BYTES) is refused RESOURCE_EXHAUSTED, every
time: by grpc core once the client has acknowledged the server's SETTINGS, by the server before
(core's limit is 16 MiB until then, and HPACK's one-byte references to a table entry make such
metadata cheap to send: an independent tester's RSS reached 1.1-1.25 GB, t89); under it every call
passes, where grpc's 8 to 16 KiB refused calls at random. What real clients send passes: the
longest API token gRPC takes, W3C trace context, a request id, and more a proxy may add. Real server
on a real port; tritonclient; raw HTTP/2 frames, whose headers `hpack` (python-hyper's, a test
requirement) writes and reads."""
from __future__ import annotations

import socket

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from aclserve import heap
from aclserve.server.auth import MAX_GRPC_TOKEN

from tests.serving import ServerThread, free_port, wait_until

from .grpc_raw import DATA, HEADERS, LIVE, PREFACE, SETTINGS, frame, whole_frames
from .hostile import metric

TOKEN = "t" * MAX_GRPC_TOKEN  # the longest the server takes with gRPC on
REAL = {"authorization": f"Bearer {TOKEN}", "traceparent": f"00-{'a' * 32}-{'b' * 16}-01",
        "tracestate": "vendor=" + "c" * 505, "x-request-id": "0b7e5a9c-2f4d-4c1e-9a53-6f0d2c8e1b47"}


def frames_until_ended(sock: socket.socket, stream: int, limit_s: float = 30.0) -> list[tuple]:
    """What the server sends, each (type, flags, stream, payload), until `stream` has ended (its
    trailers: HEADERS with END_STREAM), nothing acknowledged (the limit is a hang guard)."""
    sock.settimeout(limit_s)
    data, found = b"", []
    while not any(kind == HEADERS and flags & 0x1 and at == stream for kind, flags, at, _ in found):
        chunk = sock.recv(65536)
        assert chunk, f"closed before stream {stream} ended: {found}"
        frames, data = whole_frames(data + chunk)
        found += frames
    return found


@pytest.fixture(scope="module")
def guarded(models_dir, make_config):
    config = make_config(models_dir, api_token=TOKEN, auth_inference=True, grpc_port=free_port(),
                         keepalive_timeout_s=60)
    with ServerThread(config) as srv:
        yield srv


def test_what_real_clients_send_passes_and_more_is_refused_every_time(guarded):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{guarded.config.grpc_port}")
    try:
        for _ in range(20):  # (RepositoryIndex: the token is checked)
            assert client.get_model_repository_index(headers=REAL) is not None
        # grpc counts these 5,374 bytes (their keys and values, its own headers, 32 bytes each); with 6,626
        # more (a proxy's cookies, a larger JWT), 12,000: refused at random before, about one call in two
        proxied = dict(REAL, **{"x-pad": "p" * 6589})
        for _ in range(20):
            assert client.get_model_repository_index(headers=proxied) is not None
        over = dict(REAL, **{"x-pad": "p" * 11192})  # 16,603: over the limit by 219 bytes
        for _ in range(20):
            with pytest.raises(InferenceServerException) as refused:
                client.get_model_repository_index(headers=over)
            assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
            assert "received metadata size exceeds hard limit (16603 vs. 16384)" in refused.value.message()
    finally:
        client.close()


def test_metadata_sent_before_the_settings_are_acknowledged_is_refused_too(guarded):
    hpack = pytest.importorskip("hpack")
    trims = metric(guarded.url, "aclserve_heap_trims_total", token=TOKEN)
    encoder, decoder = hpack.Encoder(), hpack.Decoder()
    head = [(":method", "POST"), (":scheme", "http"), (":path", LIVE), (":authority", "test"),
            ("content-type", "application/grpc"), ("te", "trailers")]
    # one 235-byte entry put in the connection's table, then 100 references to it, a byte each: 23.7 KB
    block = encoder.encode([(k, v, True) for k, v in head] + [("x-big", "b" * 198)], huffman=False) + b"\xbe" * 100
    with socket.create_connection(("127.0.0.1", guarded.config.grpc_port)) as sock:
        # the client's SETTINGS, the call and its message; the server's SETTINGS never acknowledged
        sock.sendall(PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, 0x4, 1, block) + frame(DATA, 0x1, 1, b"\0" * 5))
        frames = frames_until_ended(sock, stream=1)
    heads = [dict(decoder.decode(payload)) for kind, _, stream, payload in frames if kind == HEADERS and stream == 1]
    assert not [f for f in frames if f[0] == DATA and f[2] == 1]  # not answered
    assert heads[-1]["grpc-status"] == "8"  # RESOURCE_EXHAUSTED
    assert heads[-1]["grpc-message"] == ("request metadata over 16,384 bytes, in 101 entries (each counts its key and "
                                         "value and 32 bytes, as grpc counts them): send less metadata")
    if heap.available():  # what it held given back (trim.py)
        wait_until(lambda: metric(guarded.url, "aclserve_heap_trims_total", token=TOKEN) > trims, "trimmed")

