"""The test run's own network namespace: only its processes bind and connect on its loopback.

Tests talk to 127.0.0.1 only, and their `aclserve serve` subprocesses listen on ports free_port()
found free a moment before (tests/serving.py). On a machine another test run shares (a CI host
running two at once), that run's server could take such a port between the probe and the bind:
this run's server then exited, and its test read the other run's server (a model "m" READY where
the test held its compile lock: CI, 2026-12-06). `enter()` moves this process, and so every
process it starts from then on, into a network namespace of its own with its loopback up, where
nothing outside the run can take a port. Under pytest-xdist the controller enters it and its
workers inherit it (they share it, each with its span of ports). It needs CAP_SYS_ADMIN (root,
outside a container that drops it); without it, or where the kernel refuses, the run stays where
it was. ACLSERVE_TESTS_SHARED_NETWORK=1 keeps it there too.
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct

CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
STAY_ENV = "ACLSERVE_TESTS_SHARED_NETWORK"
# set by the process that entered: a path to the namespace the run started in (its descriptor,
# kept open for the run), read by the processes that inherit it (xdist workers: `entered`)
OUTER_ENV = "ACLSERVE_TESTS_OUTER_NETWORK"
_libc = ctypes.CDLL(None, use_errno=True)  # (loaded here: a forked child does not dlopen, back_outside)


def enter() -> bool:
    """Unshare the network namespace of the calling thread (call it from the main thread before
    any other starts: threads and processes started later inherit it) and bring its loopback up.
    True when entered; False, nothing changed, when it cannot be. An xdist worker does nothing:
    it is where its controller entered."""
    if os.environ.get(STAY_ENV) or os.environ.get("PYTEST_XDIST_WORKER") or not os.path.exists("/proc/self/ns/net"):
        return False
    started_in = os.open("/proc/self/ns/net", os.O_RDONLY)
    if _libc.unshare(CLONE_NEWNET) != 0:
        os.close(started_in)
        return False  # (EPERM without CAP_SYS_ADMIN)
    try:
        _loopback_up()
    except OSError:
        if _libc.setns(started_in, CLONE_NEWNET) != 0:  # back where it was, rather than without a loopback
            raise OSError(ctypes.get_errno(), "tests/private_network.py: setns back to the machine's network")
        os.close(started_in)
        return False
    os.environ[OUTER_ENV] = f"/proc/{os.getpid()}/fd/{started_in}"
    return True


def entered() -> bool:
    """Whether this run is in a namespace of its own (entered here, or by the xdist controller)."""
    return bool(os.environ.get(OUTER_ENV))


def back_outside() -> None:
    """In a child before its exec (subprocess's preexec_fn): into the namespace the run started in."""
    fd = os.open(os.environ[OUTER_ENV], os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns")
    finally:
        os.close(fd)


def _loopback_up() -> None:
    """`ip link set lo up`, without needing iproute2: the interface flags through ioctl (an ifreq
    is 40 bytes: the name's 16, the flags' 2 and the rest of its union)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        asked = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack_from("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, asked))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))
