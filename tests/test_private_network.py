"""The test run's own loopback (tests/private_network.py): a port taken on the machine's loopback
outside the run is free inside it, and a connection to it reaches the run's own listener."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests import private_network
from tests.serving import free_port

OUTSIDE = """import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
print("listening", flush=True)
sys.stdin.read()
"""
# whether a new process may have a network namespace of its own (as private_network.enter asks)
MAY_UNSHARE = "import ctypes, os; os._exit(0 if ctypes.CDLL(None).unshare(0x40000000) == 0 else 1)"


def test_the_run_has_its_own_loopback_where_the_machine_lets_it():
    if os.environ.get(private_network.STAY_ENV):
        pytest.skip(f"{private_network.STAY_ENV} keeps the run on the machine's loopback")
    may = subprocess.run([sys.executable, "-c", MAY_UNSHARE]).returncode == 0
    assert private_network.entered() == may  # (where a process may have its own, the run has)
    if not may:
        pytest.skip("no network namespace of its own here (needs CAP_SYS_ADMIN): the run shares the loopback")
    port = free_port()
    with subprocess.Popen([sys.executable, "-c", OUTSIDE, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True, preexec_fn=private_network.back_outside) as outside:
        try:
            assert outside.stdout.readline() == "listening\n"
            with socket.socket() as inside:
                inside.bind(("127.0.0.1", port))  # (the same port outside is taken: EADDRINUSE there)
                inside.listen()
                with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
                    accepted, _ = inside.accept()
                    accepted.close()
                    assert client.getpeername()[1] == port
        finally:
            outside.kill()
