"""Fixtures every test folder may use. A folder's own conftest.py keeps what only it needs;
helpers imported by name live in tiny_models.py and serving.py beside this file."""
from __future__ import annotations

import os
import signal

import pytest

from tests import private_network

# Two CPU devices, so the cross-device rules can be tested (ignored by a real NPU). Process-wide
# and read when the runtime starts, so it is set here, before any test, whichever subset runs.
os.environ.setdefault("ACLSERVE_CPU_DEVICES", "2")
# A memcpy_async whose host side is written before the copy ran fails (the CPU runtime's
# _async_host.py): the serving path's every test checks it keeps off the buffers its copies own
# (tests/runtime took 116 s with it, 123 s without: no cost measured). Read at acl.init, as above.
os.environ.setdefault("ACLSERVE_CPU_CHECK_HOST", "1")
# as aclserve/__init__.py: a test module that imports onnxruntime before any aclserve module
# (run alone) turned ONNX Runtime's telemetry on
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
# the run's own loopback, where no other process of the machine takes the ports its servers are
# given (private_network.py); first, while this is the only thread that runs tests
private_network.enter()


@pytest.fixture(autouse=True)
def _sigint_as_python_starts():
    """SIGINT handled as Python sets it up, before each test. An in-process `serve` (its uvloop loop's
    handlers, serve's own ignoring of signals as it exits) could leave it handled by a closed loop
    or ignored, and a process a later test started inherits an ignored one: under pytest-xdist,
    where which tests share a worker varies, a test's Ctrl-C to its `aclserve profile` was lost
    now and then (the profile ran its whole --seconds)."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def runtime():
    """A started CPU AclRuntime, closed after the test."""
    from aclserve.runtime import AclRuntime
    rt = AclRuntime(device="cpu").start()
    yield rt
    rt.close()


@pytest.fixture
def host_checks(monkeypatch):
    """ACLSERVE_CPU_CHECK_HOST=1 for this test: for a runtime initialised during it (the setting
    is read at acl.init) and for one initialised before (its flag set)."""
    from aclserve.acl.cpu import _state
    monkeypatch.setenv("ACLSERVE_CPU_CHECK_HOST", "1")
    monkeypatch.setattr(_state, "check_host", True)


@pytest.fixture
def clean_faults():
    """The CPU runtime's fault table (process-wide) empty before and after the test."""
    from aclserve.acl.cpu import faults
    faults.clear()
    yield
    faults.clear()


@pytest.fixture
def compile_holds(tmp_path, monkeypatch):
    """A folder where each compile's child process (aclserve/om/compile_child.py, started by the
    server from now on) writes a file named by its pid and waits while that file exists: delete
    it to let the compile go on. Whatever is held at the end is let go."""
    folder = tmp_path / "compile-holds"
    folder.mkdir()
    monkeypatch.setenv("ACLSERVE_COMPILE_HOLD", str(folder))  # (compile_child.HOLD_ENV)
    yield folder
    for mark in folder.iterdir():
        mark.unlink(missing_ok=True)
