"""The Python API's Engine on the CPU runtime: sync, async and submitted calls, a call split
over several runs failing once or scheduled in linear work, a cancelled call; the package lists it."""
from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from aclserve.acl.cpu import faults
from aclserve.errors import ExecutionFailed
from aclserve.runtime import Engine

from tests.tiny_models import affine_reference, affine_request

pytestmark = pytest.mark.usefixtures("clean_faults")


def test_engine_sync_async_and_submit(affine_om):
    path = affine_om()
    with Engine(device="cpu") as engine:
        model = engine.load(path)
        req = affine_request(19)  # more rows than the largest gear (8): three runs
        expected = affine_reference(req["x"], req["idx"])
        out = model.infer(req)
        np.testing.assert_allclose(out["y"], expected["y"], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(out["s"], expected["s"])
        out2 = asyncio.run(model.infer_async(req))
        np.testing.assert_array_equal(out2["s"], expected["s"])
        assert model.submit(affine_request(3)).result(timeout=30)["y"].shape == (3, 4)
        with pytest.raises(ValueError, match=r"^missing input\(s\): 'idx'$"):
            model.infer({"x": req["x"]})
        with pytest.raises(ValueError, match=r"^input 'x': shape \[19, 7\] does not match the model's \[-1, 8\]$"):
            model.infer({"x": req["x"][:, :7], "idx": req["idx"]})
        # a cast numpy calls same_kind that would wrap an integer or make a finite float inf
        with pytest.raises(ValueError, match=r"input 'idx' holds 92233720368547758\d\d, outside int64's range"):
            model.infer({"x": req["x"], "idx": req["idx"].astype(np.uint64) + np.uint64(2**63)})
        with pytest.raises(ValueError, match=r"input 'x' holds -?\d.*, which rounds to -?inf as float32 \(its largest "
                                             r"is 3\.4028235e\+38\)"):
            model.infer({"x": req["x"].astype(np.float64) * 1e300, "idx": req["idx"]})
        with pytest.raises(ValueError, match=r"input 'idx' is float64, the model takes int64"):
            model.infer({"x": req["x"], "idx": req["idx"].astype(np.float64)})
        np.testing.assert_array_equal(model.infer({"x": req["x"].astype(np.float64), "idx": req["idx"]})["s"],
                                      expected["s"])  # a cast that only rounds is made


@pytest.mark.parametrize("failing_part", [1, 2, 3])
def test_an_engine_call_split_over_runs_fails_once_whichever_part_fails(affine_om, failing_part):
    """19 rows run as 8 + 8 + 3; the call fails with that part's error, exactly once, whether
    the failing part is the first, a middle or the last one to finish (the last once hung)."""
    with Engine(device="cpu") as engine:
        model = engine.load(affine_om(), slots=1, retry=False)  # one slot: parts execute in submit order
        req = affine_request(19)
        fault = faults.inject("execute", nth=failing_part)
        future = model.submit(req)
        with pytest.raises(ExecutionFailed, match="507011"):
            future.result(timeout=30)
        assert fault.fired == 1
        faults.clear()
        resolved = []
        future.add_done_callback(resolved.append)  # a done future calls back at once, only once
        assert resolved == [future]
        np.testing.assert_array_equal(model.infer(req, timeout=30)["s"], affine_reference(req["x"], req["idx"])["s"])


def test_a_cancelled_engine_call_leaves_the_model_serving(affine_om):
    """The caller gives up while its batches run (future.cancel(), or asyncio.wait_for around
    infer_async): the batches finish unheard and the instance goes on serving."""
    with Engine(device="cpu") as engine:
        model = engine.load(affine_om(), slots=1)
        req = affine_request(19)  # three runs
        gate = threading.Event()
        held = faults.inject("execute", nth=1, hold=gate)
        future = model.submit(req)
        assert held.entered.wait(30) and future.cancel()
        gate.set()

        async def give_up():
            gate2 = threading.Event()
            held2 = faults.inject("execute", nth=1, hold=gate2)
            task = asyncio.ensure_future(asyncio.wait_for(model.infer_async(req), 0.05))
            while not held2.entered.is_set():
                await asyncio.sleep(0.01)
            with pytest.raises(asyncio.TimeoutError):
                await task
            gate2.set()
        asyncio.run(give_up())
        expected = affine_reference(req["x"], req["idx"])
        np.testing.assert_array_equal(model.infer(req, timeout=30)["s"], expected["s"])


def test_a_call_split_into_many_runs_looks_at_each_waiting_run_a_bounded_number_of_times(affine_om, monkeypatch):
    """Each freed slot looked at every run still waiting: a call of 16,000 runs took 51 s
    against 4 s as separate calls (quadratic); now a freed slot looks until the slots are taken."""
    with Engine(device="cpu") as engine:
        model = engine.load(affine_om())
        picks = [0]
        pick = model.pool._pick

        def counted(batch):
            picks[0] += 1
            return pick(batch)
        monkeypatch.setattr(model.pool, "_pick", counted)
        req = affine_request(8 * 1000)  # 1,000 runs of the largest gear
        np.testing.assert_array_equal(model.infer(req, timeout=120)["s"], req["idx"] * 2)
        assert picks[0] < 10 * 1000, picks[0]  # (before: about 1000 * 1000 / 2)


def test_dir_of_the_package_lists_engine():
    """aclserve.Engine loads on first use (a module __getattr__): dir(aclserve), which help() and
    tab completion read, did not list it (found by tester t29)."""
    import aclserve
    assert {"Engine", "Closed", "ServeError"} <= set(dir(aclserve))
