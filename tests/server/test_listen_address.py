"""Where `aclserve serve --host H` listens, probed with real sockets, and what its log says.
grpc core reads 0.0.0.0 as every address, IPv6 included (a dual-stack [::] socket): gRPC then
took connections to ::1 that HTTP refused, so an operator firewalling IPv4 left gRPC open over
IPv6 (an independent tester's find). On :: it is the other way round: grpc's [::] is dual-stack
(it has no IPv6-only form) where HTTP's socket was IPv6-only, refusing 127.0.0.1 that gRPC took.

A server on every interface runs in a private network namespace (`unshare -n`, its loopback
brought up): the probe, the server and its ports exist there alone."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest

from tests import REPO
from tests.processes import leashed_popen, leashed_run, run_as_group
from tests.serving import free_port

# run inside the namespace: serve on the host given until its gRPC endpoint says it listens, probe
# each endpoint over 127.0.0.1 and ::1, print what connected and the log's lines (JSON)
PROBE = r"""
import json, socket, subprocess, sys
from tests.processes import leashed_popen  # (its server dies with it, as it dies with the test)
models, host, port, grpc_port = sys.argv[1], sys.argv[2], 18000, 18001
proc = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--models", models, "--host", host,
                      "--port", str(port), "--grpc-port", str(grpc_port), "--device", "cpu"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
lines = []
for _ in range(40):  # the start says a few lines; the gRPC one comes last
    line = proc.stderr.readline()
    if not line or "gRPC listening" in line:
        lines.append(line.rstrip())
        break
    lines.append(line.rstrip())
reached = {}
for name, at in (("http", port), ("grpc", grpc_port)):
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            reached[f"{name} {host}"] = probe.connect_ex((host, at)) == 0
proc.terminate()
proc.communicate(timeout=60)
print(json.dumps({"reached": reached, "lines": lines}))
"""


def _in_private_network(*command: str) -> subprocess.CompletedProcess:
    # (the server it starts killed with it, should it time out or fail: run_as_group)
    return run_as_group(["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *command],
                        timeout=110, cwd=REPO, env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO)))


def _probed(tmp_path, host: str) -> dict:
    """PROBE's findings for `aclserve serve --host HOST`, in a network namespace of its own."""
    (tmp_path / "models").mkdir()
    done = _in_private_network(sys.executable, "-c", PROBE, str(tmp_path / "models"), host)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _private_network_here() -> bool:
    if not (shutil.which("unshare") and shutil.which("ip")):
        return False
    return _in_private_network(sys.executable, "-c", "").returncode == 0


@pytest.mark.skipif(not _private_network_here(), reason="needs unshare -n (root) and ip, to bind every interface")
def test_grpc_on_0_0_0_0_listens_on_ipv4_only_as_http_does(tmp_path):
    found = _probed(tmp_path, "0.0.0.0")
    assert found["reached"] == {"http 127.0.0.1": True, "http ::1": False,
                                "grpc 127.0.0.1": True, "grpc ::1": False}, found
    assert found["lines"][-1].endswith("aclserve gRPC listening on 0.0.0.0:18001"), found


@pytest.mark.skipif(not _private_network_here(), reason="needs unshare -n (root) and ip, to bind every interface")
def test_http_on_ipv6_any_listens_dual_stack_as_grpc_does(tmp_path):
    """`--host ::`: IPv6 and IPv4 alike on both transports (grpc's [::] cannot be IPv6-only)."""
    found = _probed(tmp_path, "::")
    assert found["reached"] == {"http 127.0.0.1": True, "http ::1": True,
                                "grpc 127.0.0.1": True, "grpc ::1": True}, found
    said = "\n".join(found["lines"])
    assert "listening on http://[::]:18000" in said and "gRPC listening on [::]:18001" in said, found


def _in_private_hosts(hosts: str, ipv6_loopback: bool, *command: str) -> subprocess.CompletedProcess:
    """`command` in a network and mount namespace of its own, its /etc/hosts reading `hosts`, its
    loopback up (without ::1 unless `ipv6_loopback`)."""
    with tempfile.NamedTemporaryFile("w", suffix=".hosts") as file:
        file.write(hosts)
        file.flush()
        drop_ipv6 = "" if ipv6_loopback else " && ip -6 addr del ::1/128 dev lo"
        return run_as_group(["unshare", "-n", "-m", "sh", "-c", f'ip link set lo up && mount --bind "$0" /etc/hosts'
                             f'{drop_ipv6} && exec "$@"', file.name, *command],
                            timeout=110, cwd=REPO, env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO)))


def _private_hosts_here() -> bool:
    return _private_network_here() and _in_private_hosts("127.0.0.1 localhost\n", False, "true").returncode == 0


# (either line's addresses in the resolver's order: ::1 first, as glibc sorts them by RFC 6724)
@pytest.mark.skipif(not _private_hosts_here(), reason="needs unshare -n -m (root), mount and ip: its own /etc/hosts")
@pytest.mark.parametrize("hosts, ipv6_loopback, addresses", [
    # grpc's own resolver took ::1 too (c-ares reads localhost as both): HTTP refused what gRPC took
    ("127.0.0.1 localhost\n", True, ["127.0.0.1"]),
    # HTTP took the name's two addresses, gRPC its own; either in the log as `localhost` or 127.0.0.1 alone
    ("127.0.0.1 localhost\n::1 localhost\n", True, ["::1", "127.0.0.1"]),
    ("127.0.0.1 localhost\n::1 localhost\n", False, ["127.0.0.1"]),  # no IPv6 on loopback: IPv4 alone, started
])
def test_a_host_name_is_listened_on_at_the_same_addresses_by_both(tmp_path, hosts, ipv6_loopback, addresses):
    """`--host localhost`: HTTP on 127.0.0.1 alone, gRPC on [::1] and 127.0.0.1 (a tester, t84)."""
    (tmp_path / "models").mkdir()
    done = _in_private_hosts(hosts, ipv6_loopback, sys.executable, "-c", PROBE, str(tmp_path / "models"), "localhost")
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    assert found["reached"] == {f"{name} {host}": host in addresses for name in ("http", "grpc")
                                for host in ("127.0.0.1", "::1")}, found
    said = "\n".join(found["lines"])
    http = ", ".join(f"http://{host if ':' not in host else f'[{host}]'}:18000" for host in addresses)
    grpc = ", ".join(f"{host if ':' not in host else f'[{host}]'}:18001" for host in addresses)
    assert f"listening on {http}\n" in said and said.endswith(f"gRPC listening on {grpc}"), found


# run inside the namespace: the kernel's ports for port 0 narrowed to four (the namespace's own setting),
# three taken on IPv4 and the fourth on IPv6 (an IPv6-only socket), then GrpcServer.start("0.0.0.0", 0);
# prints the port it bound and what connects there over 127.0.0.1 and ::1, or its error (JSON)
ANY_PORT = r"""
import asyncio, json, socket, sys
from aclserve.server.grpc_server import GrpcServer
from tests.serving import server_config, started_app
PORTS = "/proc/sys/net/ipv4/ip_local_port_range"  # (IPv6's too)

def taken(family, port):
    sock = socket.socket(family, socket.SOCK_STREAM)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
    return sock

async def main(models):
    config = server_config(models)
    runner, state, *_ = await started_app(config)
    with open(PORTS) as f:
        wide = f.read()
    with open(PORTS, "w") as f:
        f.write("27150 27153")
    held = [taken(socket.AF_INET, port) for port in (27150, 27151, 27153)] + [taken(socket.AF_INET6, 27152)]
    for sock in held[:3]:
        sock.listen()
    server = GrpcServer(state, config.max_body_bytes)
    try:
        port = await server.start("0.0.0.0", 0)
    except OSError as e:
        found = {"error": str(e)}
    else:
        with open(PORTS, "w") as f:
            f.write(wide)  # (the probes' own ports)
        reached = {}
        for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                reached[host] = probe.connect_ex((host, port)) == 0
        found = {"port": port, "reached": reached}
    await server.stop()
    for sock in held:
        sock.close()
    await runner.cleanup()
    print(json.dumps(found))

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.skipif(not _private_network_here(), reason="needs unshare -n (root) and ip, to bind every interface")
def test_grpc_on_0_0_0_0_any_port_is_one_free_on_ipv4(tmp_path):
    """Port 0: the port was the one the kernel picked for the IPv6-only hold (grpc_ipv4_wildcard.py),
    which may be taken on IPv4, where grpc binds: "Failed to bind" while 27152 was free there."""
    (tmp_path / "models").mkdir()
    done = _in_private_network(sys.executable, "-c", ANY_PORT, str(tmp_path / "models"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "port": 27152, "reached": {"127.0.0.1": True, "::1": False}}, done.stdout


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_an_ipv6_host_is_logged_in_brackets(tmp_path):
    """`--host ::1` logged "http://::1:8000", not a URL (nor host:port for gRPC)."""
    (tmp_path / "models").mkdir()
    port, grpc_port = free_port(), free_port()
    proc = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--models", str(tmp_path / "models"), "--host",
                          "::1", "--port", str(port), "--grpc-port", str(grpc_port), "--device", "cpu"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        lines = []
        while len(lines) < 40 and not (lines and "gRPC listening" in lines[-1]):  # (a hang guard: the start's lines)
            lines.append(proc.stderr.readline().rstrip())
            if not lines[-1] and proc.poll() is not None:
                break
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    said = "\n".join(lines)
    assert f"listening on http://[::1]:{port}" in said and f"gRPC listening on [::1]:{grpc_port}" in said, said


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_an_ipv6_host_it_cannot_listen_on_is_named_in_brackets(tmp_path):
    """Its error said "cannot listen on ::1:P", which reads as no address at all."""
    (tmp_path / "models").mkdir()
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as taken:
        taken.bind(("::1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = leashed_run([sys.executable, "-m", "aclserve", "serve", "--models", str(tmp_path / "models"),
                            "--host", "::1", "--port", str(port), "--grpc-port", "0", "--device", "cpu"],
                           capture_output=True, text=True, timeout=110)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        f"aclserve serve: error: cannot listen on [::1]:{port}: Address already in use (--port PORT moves it)"], \
        proc.stderr


@pytest.mark.skipif(not _private_hosts_here(), reason="needs unshare -n -m (root), mount and ip: its own /etc/hosts")
def test_a_name_with_an_address_no_interface_has_stops_the_start(tmp_path):
    """An address of the name that is not this machine's (a stale record) stops the start as its
    bind fails, as before names were resolved once; it was left out without a word, the server
    listening on the name's other address alone (a review, r32)."""
    (tmp_path / "models").mkdir()
    done = _in_private_hosts("10.9.9.9 mixed\n127.0.0.3 mixed\n", True, sys.executable, "-c", PROBE,
                             str(tmp_path / "models"), "mixed")
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    assert not any(found["reached"].values()), found
    assert any("cannot listen on" in line and "10.9.9.9" in line for line in found["lines"]), found
