"""What the Python API raises (found by a new-user tester): classes `aclserve` exports, one for a
closed model or engine either way, each with a message."""
from __future__ import annotations

import threading

import pytest

import aclserve
from aclserve.acl.cpu import faults
from aclserve.runtime import Engine

from tests.tiny_models import affine_request

pytestmark = pytest.mark.usefixtures("clean_faults")


def test_a_closed_model_or_engine_raises_closed_either_way(affine_om):
    """A call after model.close() raised ExecutionFailed 'model m is closed', after engine.close()
    a RuntimeError; Closed is both."""
    engine = Engine(device="cpu")
    model, other = engine.load(affine_om()), engine.load(affine_om(), name="other")
    other.close()
    with pytest.raises(aclserve.Closed, match="^model other is closed$"):
        other.infer(affine_request(1))
    engine.close()
    with pytest.raises(aclserve.Closed, match="^the engine is closed: make a new Engine$"):
        model.infer(affine_request(1))
    with pytest.raises(aclserve.Closed, match="^the engine is closed"):
        engine.load(affine_om())
    assert issubclass(aclserve.Closed, RuntimeError) and issubclass(aclserve.Closed, aclserve.ExecutionFailed)


def test_an_infer_timeout_says_what_passed(affine_om):
    """infer(..., timeout=0) raised a TimeoutError with no message."""
    with Engine(device="cpu") as engine:
        model = engine.load(affine_om())
        gate = threading.Event()
        faults.inject("execute", nth=1, hold=gate, code=0)
        try:
            with pytest.raises(TimeoutError, match=r"^model affine: the call was not answered within 0 s; it runs on"):
                model.infer(affine_request(1), timeout=0)
        finally:
            gate.set()


def test_load_refusals_are_load_errors(affine_om):
    """A configuration the device cannot hold raised limits.ResourceLimitError, not a LoadError."""
    with Engine(device="cpu") as engine:
        with pytest.raises(aclserve.LoadError, match="needs .* events on device 0"):
            engine.load(affine_om(), slots=1024)
        with pytest.raises(aclserve.LoadError, match="does not exist"):
            engine.load(affine_om() + ".gone")
