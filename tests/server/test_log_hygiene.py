"""What any client can send does not write ERROR lines with tracebacks into the server's log
(ten lines a request, repeated at will, fill a disk): aiohttp's own 400s for malformed
requests become one DEBUG line, and gRPC's unoffered extensions answer UNIMPLEMENTED without
grpc's "unexpected error" traceback. Real server, raw sockets and tritonclient."""
from __future__ import annotations

import logging
import socket

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.serving import ServerThread, free_port, server_config

MALFORMED = [b"GET /x HTTP/1.1\r\nHost: a\r\nBad Header\r\n\r\n", b"GET /\x01 HTTP/1.1\r\nHost: a\r\n\r\n"]


@pytest.fixture(scope="module")
def srv(models_dir):
    config = server_config(models_dir, grpc_port=free_port(), model_control_mode="none")
    with ServerThread(config) as server:
        server.grpc_url = f"127.0.0.1:{config.grpc_port}"
        yield server


def send(url: str, data: bytes) -> bytes:
    host, port = url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(data)
        return s.recv(4096)


def loud(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


@pytest.mark.parametrize("request_bytes", MALFORMED, ids=["bad header", "control character in the path"])
def test_a_malformed_request_is_answered_400_and_logged_as_one_debug_line(srv, caplog, request_bytes):
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    assert send(srv.url, request_bytes).startswith(b"HTTP/1.0 400")
    assert not loud(caplog)
    [line] = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert line.levelno == logging.DEBUG and "\n" not in line.getMessage() and "400" in line.getMessage()


@pytest.mark.parametrize("header", [
    b"Authorization: Bearer s3cret-t0ken\x01", b"authorization: Bearer s3cret-t0ken" + b" " * 9000 + b"x",
    b"Authorization: s3cret-t0ken" + b" " * 9000 + b"x", b"Authorization: Bearer\r\n s3cret-t0ken",
], ids=["control character", "longer than aiohttp reads", "no scheme, too long", "folded"])
def test_a_malformed_request_carrying_a_token_does_not_log_it(srv, caplog, header):
    """aiohttp's error quotes the header's bytes: the DEBUG line wrote the API token."""
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    assert send(srv.url, b"GET /v2/models/affine HTTP/1.1\r\nHost: a\r\n" + header + b"\r\n\r\n")[:12] in (
        b"HTTP/1.0 400", b"HTTP/1.1 400")
    [line] = [r.getMessage() for r in caplog.records if r.name == "aiohttp.server"]
    assert "s3cret" not in line and "400" in line, line


def test_at_info_a_malformed_request_logs_nothing(srv, caplog):
    caplog.set_level(logging.INFO)
    assert send(srv.url, MALFORMED[0]).startswith(b"HTTP/1.0 400")
    assert not [r for r in caplog.records if r.name == "aiohttp.server"]


def test_grpc_extensions_not_offered_answer_unimplemented_without_a_traceback(srv, caplog):
    caplog.set_level(logging.INFO)
    with grpcclient.InferenceServerClient(srv.grpc_url) as client:
        for call in (client.get_log_settings, client.get_system_shared_memory_status,
                     client.get_cuda_shared_memory_status, lambda: client.unregister_system_shared_memory("r")):
            with pytest.raises(InferenceServerException) as refused:
                call()
            assert refused.value.status() == "StatusCode.UNIMPLEMENTED"
            assert "not supported by aclserve" in refused.value.message()
    assert not loud(caplog)


def test_a_text_log_line_escapes_c1_controls_and_unicode_line_separators(models_dir, caplog):
    """aiohttp's access log (at debug) quoted a User-Agent's C1 controls (U+009B, a terminal's
    CSI; U+0085, NEL) and U+2028 / U+2029 raw into the text log: only C0 controls and DEL were
    escaped."""
    from aclserve.logs import TEXT_FORMAT, TextFormatter
    caplog.set_level(logging.DEBUG, logger="aiohttp.access")
    agent = "x\u009b31m\u0085\u2028\u2029\u0080\u009fy"
    with ServerThread(server_config(models_dir, log_level="debug", model_control_mode="none")) as server:
        assert send(server.url, b"GET /v2/health/live HTTP/1.1\r\nHost: a\r\nConnection: close\r\nUser-Agent: "
                    + agent.encode() + b"\r\n\r\n").startswith(b"HTTP/1.1 200")
    [record] = [r for r in caplog.records if r.name == "aiohttp.access" and "/v2/health/live" in r.getMessage()]
    assert agent in record.getMessage()  # (as aiohttp decoded the header)
    line = TextFormatter(TEXT_FORMAT).format(record)
    assert "x\\x9b31m\\x85\\u2028\\u2029\\x80\\x9fy" in line
    assert not any("\x80" <= c <= "\x9f" or c in "\u2028\u2029" for c in line), line
