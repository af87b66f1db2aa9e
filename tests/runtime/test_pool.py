"""Model runtime on the CPU runtime: gears and padding, many batches, faults, memory."""
from __future__ import annotations

import logging
import random
import re
import threading

import numpy as np
import pytest

from aclserve.acl.cpu import faults
from aclserve.errors import ExecutionFailed
from aclserve.runtime import LoadError, open_pool, packing, warm_up
from aclserve.runtime.futures import BatchFutures

from tests.serving import wait_until
from tests.tiny_models import affine_reference, affine_request

pytestmark = pytest.mark.usefixtures("clean_faults")



def test_every_gear_and_padding_matches_the_reference(runtime, affine_om):
    pool = open_pool(runtime, affine_om(), "affine", slots=2)
    done = BatchFutures(pool)
    try:
        assert pool.gears == (1, 2, 4, 8)
        assert [s.name for s in pool.inputs] == ["x", "idx"]
        assert pool.inputs[0].shape == (-1, 8) and pool.outputs[1].datatype == "INT64"
        for gear in pool.gears:
            for rows in sorted({1, gear - 1 or 1, gear}):
                req = affine_request(rows, first_id=gear * 100 + rows)
                result = done.submit([req], gear).result(timeout=30)
                assert result.gear == gear and result.rows == rows
                expected = affine_reference(req["x"], req["idx"])
                np.testing.assert_allclose(result.outputs[0]["y"], expected["y"], rtol=1e-5, atol=1e-5)
                np.testing.assert_array_equal(result.outputs[0]["s"], expected["s"])
                assert result.timings.compute_ms > 0
    finally:
        pool.close()


def test_requests_in_one_batch_get_their_own_rows(runtime, affine_om):
    pool = open_pool(runtime, affine_om(), "affine")
    done = BatchFutures(pool)
    try:
        reqs = [affine_request(1, 0), affine_request(2, 10), affine_request(1, 20)]
        result = done.submit(reqs, 8).result(timeout=30)
        assert len(result.outputs) == 3
        for req, out in zip(reqs, result.outputs):
            assert out["y"].shape == (len(req["x"]), 4)
            np.testing.assert_array_equal(out["s"], req["idx"] * 2)
    finally:
        pool.close()


@pytest.mark.parametrize("shared_bytes", [packing.SHARED_COPY_BYTES, 0])
def test_answers_outlive_the_slot_whether_a_batch_output_is_copied_once_or_per_request(
        runtime, affine_om, monkeypatch, shared_bytes):
    """Small outputs are copied out of the slot once per batch (each request a view of that copy),
    larger ones per request: either way a request's rows are its own and stay as they were
    when the slot runs the next batches."""
    monkeypatch.setattr(packing, "SHARED_COPY_BYTES", shared_bytes)
    pool = open_pool(runtime, affine_om(), "affine", slots=1)
    done = BatchFutures(pool)
    try:
        reqs = [affine_request(1, 0), affine_request(2, 10), affine_request(1, 20)]
        first = done.submit(reqs, 4).result(timeout=30).outputs
        kept = [{name: arr.copy() for name, arr in out.items()} for out in first]
        for i in range(5):  # the one slot runs other rows meanwhile
            done.submit([affine_request(4, 100 + i)], 4).result(timeout=30)
        for req, out, before in zip(reqs, first, kept):
            np.testing.assert_array_equal(out["s"], req["idx"] * 2)
            np.testing.assert_allclose(out["y"], affine_reference(**req)["y"], rtol=1e-5)
            np.testing.assert_array_equal(out["y"], before["y"])
        bases = [out["y"].base for out in first]
        if shared_bytes:  # views of one copy
            assert bases[0] is not None and all(base is bases[0] for base in bases)
        else:  # arrays of their own
            assert bases == [None, None, None]
    finally:
        pool.close()


def test_a_thousand_batches_across_instances_and_slots_each_answered_once(runtime, affine_om):
    pool = open_pool(runtime, affine_om(), "affine", instances=2, slots=3)
    done = BatchFutures(pool)
    rng = random.Random(3)
    next_id = 0
    submitted = []
    try:
        for _ in range(1000):
            gear = rng.choice(pool.gears)
            reqs, rows = [], 0
            while rows < gear:
                n = rng.randint(1, gear - rows)
                reqs.append(affine_request(n, next_id))
                next_id += n
                rows += n
                if rng.random() < 0.4:
                    break
            submitted.append((reqs, done.submit(reqs, gear)))
        seen = set()
        instances = set()
        for reqs, future in submitted:
            result = future.result(timeout=60)
            instances.add(result.instance)
            assert len(result.outputs) == len(reqs)
            for req, out in zip(reqs, result.outputs):
                np.testing.assert_array_equal(out["s"], req["idx"] * 2)
                ids = out["s"][:, 0] // 2
                assert not seen.intersection(ids.tolist())
                seen.update(ids.tolist())
        assert seen == set(range(next_id))
        assert len(instances) == 2
    finally:
        pool.close()


def test_batches_naming_no_instance_take_the_instances_in_turn_at_low_load(runtime, affine_om):
    """One batch at a time went to the first instance each time (ties of free slots went to the first):
    its device ran hotter than the other. tests/server/test_instance_turns.py: the server."""
    pool = open_pool(runtime, affine_om(), "affine", instances=2, slots=2)
    done = BatchFutures(pool)
    try:
        ran_on = []
        for index in range(6):
            result = done.submit([affine_request(1, index)], 1).result(timeout=30)
            np.testing.assert_array_equal(result.outputs[0]["s"], affine_request(1, index)["idx"] * 2)
            ran_on.append(result.instance)
            # its slot back (it comes after the answer): both instances tie again
            wait_until(lambda: pool.lanes() == [2, 2], "the batch's slot back")
        assert ran_on == [pool.instances[k % 2].name for k in range(6)], ran_on
    finally:
        pool.close()


def test_a_device_fault_fails_only_its_batch_and_the_instance_keeps_serving(runtime, affine_om):
    pool = open_pool(runtime, affine_om(), "affine", slots=2, retry=False)
    done = BatchFutures(pool)
    try:
        faults.inject("execute", nth=1)
        with pytest.raises(ExecutionFailed, match="507011"):
            done.submit([affine_request(2)], 2).result(timeout=30)
        result = done.submit([affine_request(2, 5)], 2).result(timeout=30)
        np.testing.assert_array_equal(result.outputs[0]["s"], affine_request(2, 5)["idx"] * 2)
    finally:
        pool.close()


def test_a_rebuilt_instance_serving_again_is_said_at_info(runtime, affine_om, caplog):
    """A recovery: "rebuilt; serving again" was a WARNING, so an alert on warnings fired twice
    for one fault (the fault and the rebuild it began are said at ERROR and WARNING)."""
    pool = open_pool(runtime, affine_om(), "affine", retry=False)
    done = BatchFutures(pool)
    try:
        with caplog.at_level(logging.INFO, logger="aclserve"):
            faults.inject("execute", nth=1)
            with pytest.raises(ExecutionFailed):
                done.submit([affine_request(2)], 2).result(timeout=30)
            done.submit([affine_request(2)], 2).result(timeout=30)  # on the rebuilt instance
    finally:
        pool.close()
    said = {r.getMessage(): r.levelname for r in caplog.records}
    assert said["affine: rebuilding instance affine#0 (the device failed a task (507011) and the instance's "
                "context stopped on it)"] == "WARNING"
    assert said["affine: instance affine#0 rebuilt; serving again"] == "INFO"


def test_a_failed_batch_is_retried_once_on_another_instance(runtime, affine_om):
    pool = open_pool(runtime, affine_om(), "affine", instances=2, retry=True)
    done = BatchFutures(pool)
    try:
        fault = faults.inject("execute", nth=1)
        result = done.submit([affine_request(4)], 4).result(timeout=30)
        assert fault.fired == 1
        np.testing.assert_array_equal(result.outputs[0]["s"], affine_request(4)["idx"] * 2)
    finally:
        pool.close()


def test_fifty_load_unload_cycles_return_device_memory(runtime, affine_om):
    path = affine_om()
    device = runtime.device(0)
    baseline = device.mem_info()[0]
    for cycle in range(50):
        pool = open_pool(runtime, path, "affine", instances=2, slots=2)
        done = BatchFutures(pool)
        assert device.mem_info()[0] < baseline
        done.submit([affine_request(1, cycle)], 1).result(timeout=30)
        pool.close()
        pool.close()  # safe twice
        assert device.mem_info()[0] == baseline


def test_loading_into_the_memory_reserve_fails_with_the_figures(runtime, affine_om):
    from aclserve.runtime import AclRuntime
    free, total = runtime.device(0).mem_info()
    # A reserve that leaves 64 bytes usable: less than any model needs (no unload makes room: said so).
    rt = AclRuntime(device="cpu", memory_reserve_fraction=(free - 64) / total).start()
    try:
        with pytest.raises(LoadError, match=r"model affine.* needs [\d,]+ bytes .* more than the device's memory "
                                            r"less its reserve \([\d,]+ of [\d,]+ bytes"):
            open_pool(rt, affine_om(), "affine")
    finally:
        rt.close()


def test_an_atc_om_is_refused_with_what_it_is_and_what_to_do(runtime, tmp_path):
    import struct
    head = bytearray(256)
    head[0:4] = b"IMOD"
    struct.pack_into("<II", head, 4, 256, 0x20000000)
    struct.pack_into("<I", head, 76, 16)
    head[84:90] = b"resnet"
    path = tmp_path / "resnet.om"
    path.write_bytes(bytes(head) + b"x" * 16)
    with pytest.raises(LoadError, match=r"ATC OM \('resnet'.*needs CANN.*--target cpu.*145006"):
        open_pool(runtime, str(path), "resnet")


def test_instances_spread_over_several_devices_and_each_device_gets_its_memory_back(runtime, affine_om):
    if runtime.device_count() < 2:
        pytest.skip("needs two devices (ACLSERVE_CPU_DEVICES=2, set by tests/conftest.py)")
    path = affine_om()
    before = [runtime.device(d).mem_info()[0] for d in (0, 1)]
    pool = open_pool(runtime, path, "affine", instances=2, devices=(0, 1))
    done = BatchFutures(pool)
    try:
        assert [i.device.id for i in pool.instances] == [0, 1]
        assert all(runtime.device(d).mem_info()[0] < before[d] for d in (0, 1))
        results = [done.submit([affine_request(2, 10 * k)], 2) for k in range(20)]
        assert {f.result(timeout=30).instance for f in results} == {"affine#0", "affine#1"}
    finally:
        pool.close()
    assert [runtime.device(d).mem_info()[0] for d in (0, 1)] == before


def test_every_listed_device_must_exist_not_only_those_the_instances_land_on(runtime, affine_om):
    """`devices: [0, 5]` with one instance loaded on a host of one device, /config showing "0,5",
    and failed only once a second instance was placed on device 5 (an independent check)."""
    count = runtime.device_count()
    has = "device 0" if count == 1 else f"devices 0..{count - 1}"
    with pytest.raises(ValueError, match=re.escape(f"devices [0, {count + 3}]: this host has no device {count + 3} "
                                                   f"(it has {has}: the ids this process sees, from 0)")):
        open_pool(runtime, affine_om(), "affine", instances=1, devices=(0, count + 3))


def test_a_batch_waits_for_the_lane_it_names_while_another_instance_is_free(runtime, affine_om):
    pool = open_pool(runtime, affine_om(), "affine", instances=2, slots=2)
    done = BatchFutures(pool)
    gate = threading.Event()
    try:
        assert pool.lanes() == [2, 2]
        held = faults.inject("execute", nth=1, hold=gate)
        first = done.submit([affine_request(1, 0)], 1, lane=0)
        assert held.entered.wait(30)
        queued = [done.submit([affine_request(1, k)], 1, lane=0) for k in (1, 2)]
        assert pool.lanes() == [0, 2]  # one slot holds the second batch; the third waits for lane 0
        gate.set()
        results = [future.result(timeout=30) for future in [first] + queued]
        assert {r.instance for r in results} == {pool.instances[0].name}
        for k, result in enumerate(results):
            np.testing.assert_array_equal(result.outputs[0]["s"], affine_request(1, k)["idx"] * 2)
        assert done.submit([affine_request(1, 3)], 1, lane=1).result(timeout=30).instance == pool.instances[1].name
        with pytest.raises(ValueError, match="lane 2"):
            done.submit([affine_request(1, 4)], 1, lane=2)
    finally:
        gate.set()
        pool.close()


def test_warmup_times_each_gear_and_its_device_compute(runtime, affine_om):
    pool = open_pool(runtime, affine_om(), "affine")
    try:
        gear_cost = warm_up(pool)
        assert sorted(gear_cost) == sorted(pool.compute_cost) == list(pool.gears)
        for gear in pool.gears:
            assert 0 < pool.compute_cost[gear] <= gear_cost[gear]
    finally:
        pool.close()


def test_a_missing_model_file_is_a_load_error_naming_it(runtime, tmp_path):
    with pytest.raises(LoadError, match="nope.om does not exist"):
        open_pool(runtime, str(tmp_path / "nope.om"), "nope")


@pytest.mark.usefixtures("clean_faults")
@pytest.mark.parametrize("batch, gear, described", [("1", None, "batch of 1 row"),
                                                     ("2,4", 4, "batch of 3 rows (gear 4)")])
def test_a_failed_batch_says_its_rows_and_gear_where_it_has_one(runtime, affine_om, batch, gear, described):
    """A static model's failed batch said "batch of 1 rows (gear None)" (found by a helper)."""
    pool = open_pool(runtime, affine_om(batch=batch), "affine", retry=False)
    done = BatchFutures(pool)
    try:
        faults.inject("execute", nth=1, code=507011)
        with pytest.raises(ExecutionFailed, match=rf"^{re.escape(described)} failed on device 0, instance "):
            done.submit([affine_request(1 if gear is None else 3)], gear).result(timeout=30)
    finally:
        pool.close()
