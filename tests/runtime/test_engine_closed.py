"""A closed Engine stays closed (found by an independent check of the Python API): it refuses
loads and calls saying so, and closes racing each other (two closers, a model's close beside the
engine's) leave the runtime finalized. How a close treats the calls under way is test_engine_close.py's."""
from __future__ import annotations

import threading

import pytest

from aclserve.runtime import Engine

from tests.tiny_models import affine_request

pytestmark = pytest.mark.usefixtures("clean_faults")


def test_a_closed_engine_refuses_loads(affine_om):
    """A load after close() restarted the runtime quietly (models listed after close, their
    threads running)."""
    engine = Engine(device="cpu")
    engine.load(affine_om())
    engine.close()
    with pytest.raises(RuntimeError, match="the engine is closed"):
        engine.load(affine_om())


def test_a_closed_engine_refuses_calls_saying_so(affine_om):
    """A call on a model of a closed engine failed with "model affine is closed", which the
    caller had not closed; it is refused at once, as a load is."""
    engine = Engine(device="cpu")
    model = engine.load(affine_om())
    engine.close()
    with pytest.raises(RuntimeError, match="the engine is closed: make a new Engine"):
        model.infer(affine_request(1))
    with pytest.raises(RuntimeError, match="the engine is closed: make a new Engine"):  # (answered, not
        model.submit(affine_request(1)).result(timeout=0)  # raised: a done-callback chaining calls gets it)


def test_two_threads_closing_at_once_leave_the_runtime_finalized(affine_om, caplog):
    """The second closer found no model left and closed the runtime while the first still
    closed an instance: the device was not reset, ACL not finalized and a context kept, once
    per such close (found by a helper's leak hunt)."""
    for _ in range(3):
        engine = Engine(device="cpu")
        model = engine.load(affine_om())
        calls = [model.submit(affine_request(2, first_id=k)) for k in range(50)]
        closers = [threading.Thread(target=engine.close) for _ in range(2)]
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join(60)
        assert all(call.done() for call in calls)
    assert "not finalized" not in caplog.text and "not reset" not in caplog.text, caplog.text


def test_a_model_closed_while_the_engine_closes_is_waited_for(affine_om, caplog):
    """EngineModel.close() racing Engine.close() from another thread: the engine returned while
    the model's instance still closed (the device not reset, ACL not finalized); and a model
    closed alone stayed in engine.models."""
    engine = Engine(device="cpu")
    kept, closed = engine.load(affine_om()), engine.load(affine_om(), name="other")
    closed.close()
    assert engine.models == [kept]
    closers = [threading.Thread(target=kept.close), threading.Thread(target=engine.close)]
    for closer in closers:
        closer.start()
    for closer in closers:
        closer.join(60)
    assert "not finalized" not in caplog.text and "not reset" not in caplog.text, caplog.text
