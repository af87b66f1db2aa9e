"""What a done-callback of an Engine call may do, on the engine's own thread: the calls that
would wait for that thread (closes, infer) say why they cannot, even after a call of its own
answered at once, and one raising SystemExit or KeyboardInterrupt leaves the model serving."""
from __future__ import annotations

import threading

import pytest

from aclserve.acl.cpu import faults
from aclserve.runtime import Engine

from tests.tiny_models import affine_request

pytestmark = pytest.mark.usefixtures("clean_faults")


def in_a_done_callback(model, blocking) -> list[str]:
    """Run `blocking` in a done-callback of one of `model`'s calls, on the engine's own thread
    (the call ends once its callbacks are added); the RuntimeErrors it raised."""
    said = []

    def call_here(_future):
        try:
            blocking()
        except RuntimeError as e:
            said.append(str(e))
    done, gate = threading.Event(), threading.Event()
    faults.inject("execute", nth=1, hold=gate, code=0)
    future = model.submit(affine_request(1))
    future.add_done_callback(call_here)
    future.add_done_callback(lambda _f: done.set())
    gate.set()
    assert done.wait(60)
    return said


@pytest.mark.parametrize("call", ["Engine.close", "EngineModel.close", "EngineModel.infer"])
def test_blocking_calls_from_a_done_callback_say_why_they_cannot(affine_om, call):
    """They wait for the engine's own threads, this one among them: EngineModel.close() failed
    with 'cannot join current thread' and left its instance behind, infer() waited for good on a
    one-instance model (found by a helper's misuse of the Python API)."""
    with Engine(device="cpu") as engine:
        model = engine.load(affine_om())
        blocking = {"Engine.close": engine.close, "EngineModel.close": model.close,
                    "EngineModel.infer": lambda: model.infer(affine_request(1))}[call]
        said = in_a_done_callback(model, blocking)
        assert model.infer(affine_request(1), timeout=30)["s"].shape == (1, 3)  # the engine still serves
    assert len(said) == 1 and f"{call}() cannot run in a done-callback" in said[0], said


@pytest.mark.parametrize("raised", [SystemExit, KeyboardInterrupt])
def test_a_done_callback_raising_systemexit_leaves_the_model_serving(affine_om, raised):
    """concurrent.futures lets a callback's SystemExit or KeyboardInterrupt through: it ended the
    instance's completion thread, and every later call waited for good."""
    with Engine(device="cpu") as engine:
        model = engine.load(affine_om())

        def leave(_future):
            raise raised()
        model.submit(affine_request(1)).add_done_callback(leave)
        for k in range(5):  # one instance: each call needs its completion thread
            assert model.infer(affine_request(1, first_id=k), timeout=30)["s"].shape == (1, 3)


def test_a_callback_s_own_call_answered_at_once_keeps_the_refusals(affine_om):
    """A callback's submit() on a closed model is answered at once on the same thread: its
    answer cleared the thread's mark, and a blocking infer() after it waited for good (found
    by a review)."""
    with Engine(device="cpu") as engine:
        model, closed = engine.load(affine_om()), engine.load(affine_om(), name="gone")
        closed.close()

        def nested():
            closed.submit(affine_request(1))  # "is closed", answered here
            model.infer(affine_request(1), timeout=30)
        said = in_a_done_callback(model, nested)
    assert said and "cannot run in a done-callback" in said[0], said
