"""Engines whose lives overlap: each closed Engine gives back the device it set and the contexts
it made, whatever another Engine still runs there (found by tester t46: a long-lived Engine and
two threads opening and closing 100 Engines left 9 contexts and 9 device references behind).
The work of another Engine on the device is on that Engine's own set_device."""
from __future__ import annotations

import threading

import pytest

from aclserve.acl.cpu import _state, faults
from aclserve.runtime import Engine, teardown

from tests.hung_device import let_go
from tests.tiny_models import affine_request

pytestmark = pytest.mark.usefixtures("clean_faults")


def device_state() -> tuple[int, int]:
    """(contexts, device 0's set_device count) in the CPU runtime."""
    contexts = len(_state.contexts) + sum(d.default_context is not None for d in _state.devices.values())
    return contexts, _state.devices[0].refcount


def test_an_engine_closed_while_another_still_runs_work_on_the_device_gives_it_back(affine_om):
    path = affine_om()
    keep = Engine(device="cpu")  # ACL stays initialised throughout
    keep.load(path)
    other = Engine(device="cpu")
    model = other.load(path)
    gate = threading.Event()
    held = faults.inject("execute", nth=1, hold=gate, code=0)
    call = model.submit(affine_request(1))
    try:
        assert held.entered.wait(60)
        other.close(timeout=0)  # its instance is abandoned under the held run: its device stays set
        assert teardown.unreleased(0) > 0
        before = device_state()
        with Engine(device="cpu") as short_lived:
            short_lived.load(path)
        assert device_state() == before, "the short-lived Engine left its device reference or contexts behind"
    finally:
        let_go(gate)
    call.exception(timeout=60)
    keep.close()
