"""Where `aclserve serve --host H` listens, probed with real sockets, and what its log says.
grpc core reads 0.0.0.0 as every address, IPv6 included (a dual-stack [::] socket): gRPC then
took connections to ::1 that HTTP refused, so an operator firewalling IPv4 left gRPC open over
IPv6 (an independent tester's find)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.serving import free_port

START_LINES = 40  # the start says a few lines; the gRPC one comes last


def _serve_until_listening(tmp_path, host: str) -> tuple[subprocess.Popen, list[str], int, int]:
    """`aclserve serve --host host` on free ports, read until its gRPC endpoint says it listens."""
    (tmp_path / "models").mkdir()
    port, grpc_port = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "aclserve", "serve", "--models", str(tmp_path / "models"),
                             "--host", host, "--port", str(port), "--grpc-port", str(grpc_port), "--device", "cpu"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    lines = []
    for _ in range(START_LINES):
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if "gRPC listening" in line:
            return proc, lines, port, grpc_port
    proc.kill()
    proc.wait()
    pytest.fail("\n".join(lines))


def _stopped(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.communicate(timeout=60)


def _connects(family: int, host: str, port: int) -> bool:
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.connect((host, port))
        except ConnectionRefusedError:
            return False
        return True


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback here")
def test_grpc_on_0_0_0_0_listens_on_ipv4_only_as_http_does(tmp_path):
    proc, lines, port, grpc_port = _serve_until_listening(tmp_path, "0.0.0.0")
    try:
        reached = {(name, address): _connects(family, address, at)
                   for name, at in (("http", port), ("grpc", grpc_port))
                   for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1"))}
    finally:
        _stopped(proc)
    assert reached == {("http", "127.0.0.1"): True, ("http", "::1"): False,
                       ("grpc", "127.0.0.1"): True, ("grpc", "::1"): False}, lines
    assert lines[-1].endswith(f"aclserve gRPC listening on 0.0.0.0:{grpc_port}"), lines
