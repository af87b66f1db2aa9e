"""The test run's own loopback (tests/private_network.py): a port taken on the machine's loopback
outside the run is free inside it, and a connection to it reaches the run's own listener."""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys

from tests import private_network
from tests.conftest import PRIVATE_NETWORK
from tests.serving import free_port

OUTSIDE = """import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
print("listening", flush=True)
sys.stdin.read()
"""


def _unshare_works() -> bool:
    return bool(shutil.which("unshare")) and subprocess.run(["unshare", "-n", "true"],
                                                             capture_output=True).returncode == 0


def test_the_run_has_its_own_loopback_where_the_machine_lets_it():
    assert PRIVATE_NETWORK == _unshare_works()  # (a root shell's `unshare -n` works: so does the run's)
    if not PRIVATE_NETWORK:
        return  # (nothing more to look at: the run shares the machine's loopback, as before)
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
