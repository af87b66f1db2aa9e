"""Model runtime on the CPU runtime: a hung batch, its execution timeout and the rebuild of its instance."""
from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pytest

from aclserve.acl import constants as C
from aclserve.acl.cpu import faults
from aclserve.errors import DeviceTimeout
from aclserve.runtime import open_pool, warm_up
from aclserve.runtime.batch import Batch
from aclserve.runtime.futures import BatchFutures
from aclserve.runtime.execution_timeout import TIMEOUT_CEILING_MS, TIMEOUT_FLOOR_MS
from aclserve.trace.records import BatchTrace, now_ns

from tests import REPO
from tests.hung_device import GENEROUS_TIMEOUT_MS, short_timeout_only_on
from tests.tiny_models import affine_request

pytestmark = pytest.mark.usefixtures("clean_faults")


def test_a_hung_batch_times_out_and_its_instance_is_rebuilt(runtime, affine_om):
    pool = open_pool(runtime, affine_om(), "affine", execution_timeout_ms=100)
    short_timeout_only_on(pool)  # the rebuilt instance's batch gets a generous one
    done = BatchFutures(pool)
    gate = threading.Event()
    try:
        first = pool.instances[0]
        held = faults.inject("execute", nth=1, hold=gate)  # the device never answers this one
        with pytest.raises(DeviceTimeout, match="within the model's execution timeout"):
            done.submit([affine_request(1)], 1).result(timeout=30)
        assert held.fired == 1 and first.broken
        # The next batch waits for the rebuilt instance (the old one is still held) and runs there.
        result = done.submit([affine_request(1, 9)], 1).result(timeout=30)
        np.testing.assert_array_equal(result.outputs[0]["s"], affine_request(1, 9)["idx"] * 2)
        assert pool.instances[0] is not first and pool.rebuilds == 1
        assert pool.fault_counts() == {C.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT: 1}
    finally:
        gate.set()
        pool.close()


ROOM_FOR_ONE = """
import sys, threading
import numpy as np
from aclserve.acl.cpu import faults
from aclserve.errors import DeviceTimeout
from aclserve.runtime import AclRuntime, open_pool
from aclserve.runtime.futures import BatchFutures
from tests.hung_device import short_timeout_only_on
from tests.tiny_models import affine_request
rt = AclRuntime(device="cpu", memory_reserve_fraction=0.0).start()
pool = open_pool(rt, sys.argv[1], "affine", execution_timeout_ms=100)
short_timeout_only_on(pool)  # the rebuilt instance's batch gets a generous one
done, gate, first = BatchFutures(pool), threading.Event(), pool.instances[0]
faults.inject("execute", nth=1, hold=gate)
try:
    done.submit([affine_request(1)], 1).result(timeout=60)
except DeviceTimeout:
    pass
gate.set()  # the device lets go of the hung batch
result = done.submit([affine_request(1, 9)], 1).result(timeout=60)  # waits for the rebuilt instance
np.testing.assert_array_equal(result.outputs[0]["s"], affine_request(1, 9)["idx"] * 2)
assert pool.instances[0] is not first and pool.rebuilds == 1, (pool.instances, pool.rebuilds)
pool.close()
rt.close()
print("rebuilt")
"""


def test_a_rebuild_needing_the_memory_of_the_instance_it_replaces_closes_that_one_first(affine_om):
    """A device with room for one copy of the model (found by an independent check): the rebuild
    after a hang failed for want of memory forever, since the old instance was closed only once
    the new one was built. A fresh process: the CPU runtime reads its capacity at acl.init."""
    env = dict(os.environ, ACLSERVE_CPU_DEVICE_MEMORY="5000")  # one instance takes 3,392 bytes
    proc = subprocess.run([sys.executable, "-c", ROOM_FOR_ONE, affine_om()], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "rebuilt" in proc.stdout, proc.stderr[-3000:]
    assert "closing it first, then trying again" in proc.stderr


def test_a_rebuild_loads_the_file_the_pool_opened_not_one_replaced_since(runtime, affine_om):
    """A rebuild must not load a file replaced at the model's path meanwhile (the repository
    serves it as a new version): it reads the one the pool opened, through the descriptor kept
    for that. It refused instead, so a version still serving after its replacement failed to
    load (garbage renamed over it) lost an instance for good to each device fault (found by a
    helper's fault matrix: one fault per instance, the model down until a good file came)."""
    from tests.tiny_models import affine_reference
    path = affine_om()
    pool = open_pool(runtime, path, "affine", execution_timeout_ms=100)
    short_timeout_only_on(pool)
    done = BatchFutures(pool)
    gate = threading.Event()
    try:
        first = pool.instances[0]
        os.replace(affine_om(scale=5.0, name="other"), path)  # another model (y = 5x) under the same name
        faults.inject("execute", nth=1, hold=gate)
        with pytest.raises(DeviceTimeout):
            done.submit([affine_request(1)], 1).result(timeout=30)
        assert first.broken
        request = affine_request(2, first_id=7)
        answer = done.submit([request], 2).result(timeout=60)  # waits for the rebuilt instance
        assert pool.instances[0] is not first and pool.rebuilds == 1
        np.testing.assert_allclose(answer.outputs[0]["y"], affine_reference(**request)["y"], rtol=1e-5)
    finally:
        gate.set()
        pool.close()


@pytest.mark.parametrize("how", ["hard link", "moved away"])
def test_a_rebuild_reads_the_kept_file_when_its_other_name_remains_or_it_was_moved(runtime, affine_om, tmp_path,
                                                                                    how, monkeypatch):
    """Its ctime moves when it is renamed or one of its links goes, which changes nothing in it:
    judged by the ctime too, a hard-linked release (rsync --link-dest) with garbage renamed over
    it, or a file moved out of the folder, could not rebuild (found by a review)."""
    from tests.tiny_models import affine_reference
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temp"))  # where the rebuild's copy goes
    os.mkdir(tmp_path / "temp")
    path = affine_om()
    if how == "hard link":
        os.link(path, tmp_path / "release-v1.om")
    pool = open_pool(runtime, path, "affine", execution_timeout_ms=100)
    short_timeout_only_on(pool)
    done = BatchFutures(pool)
    gate = threading.Event()
    try:
        if how == "hard link":
            (tmp_path / "garbage").write_bytes(b"not a model" * 10)
            os.replace(tmp_path / "garbage", path)
        else:
            os.replace(path, tmp_path / "elsewhere.om")
        faults.inject("execute", nth=1, hold=gate)
        with pytest.raises(DeviceTimeout):
            done.submit([affine_request(1)], 1).result(timeout=30)
        request = affine_request(2, first_id=3)
        answer = done.submit([request], 2).result(timeout=60)  # waits for the rebuilt instance
        assert pool.rebuilds == 1
        np.testing.assert_allclose(answer.outputs[0]["y"], affine_reference(**request)["y"], rtol=1e-5)
        assert os.listdir(tmp_path / "temp") == []  # the copy, deleted once loaded
    finally:
        gate.set()
        pool.close()


def test_a_fifo_in_place_of_the_model_is_refused_without_waiting_for_a_writer(runtime, tmp_path):
    """The kept file was opened plainly, before the load refused what is not a regular file: a
    FIFO held open_pool (and Engine.load, and so Engine.close) until a writer came."""
    from aclserve.runtime.device import LoadError
    os.mkfifo(tmp_path / "m.om")
    with pytest.raises(LoadError, match="is not a regular file"):
        open_pool(runtime, str(tmp_path / "m.om"), "m")


def test_a_rebuild_never_loads_a_file_rewritten_in_place(runtime, affine_om, tmp_path, caplog):
    """Rewritten in place (the same inode), the kept descriptor reads the new bytes too: refused,
    also when the size is the same and the mtime is set back (`cp -p` between builds of fixed
    mtimes: judged without the ctime, the other model was loaded; found by a review)."""
    path = affine_om()
    before = os.stat(path)
    pool = open_pool(runtime, path, "affine", execution_timeout_ms=100)
    done = BatchFutures(pool)
    gate = threading.Event()
    try:
        first = pool.instances[0]
        with open(path, "r+b") as same_inode:  # other bytes, the same size
            middle = before.st_size // 2
            same_inode.seek(middle)
            byte = same_inode.read(1)
            same_inode.seek(middle)
            same_inode.write(bytes([byte[0] ^ 0xFF]))
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # and the mtime set back
        faults.inject("execute", nth=1, hold=gate)
        with pytest.raises(DeviceTimeout):
            done.submit([affine_request(1)], 1).result(timeout=30)
        assert first.broken
        for _ in range(200):  # the rebuild's first attempt is made at once
            if "changed since" in caplog.text:
                break
            threading.Event().wait(0.05)
        assert "changed since" in caplog.text and pool.instances[0] is first and pool.rebuilds == 0
    finally:
        gate.set()
        pool.close()


def test_a_traced_batch_behind_a_hung_one_waits_no_longer_than_the_execution_timeout(runtime, affine_om, caplog):
    """Anchoring the trace clock waits for the compute stream; behind a hung batch that wait
    ends at the model's execution timeout (it was a fixed 60 s), and the traced batch fails
    with the hung one instead of holding the launcher."""
    pool = open_pool(runtime, affine_om(), "affine", slots=2, execution_timeout_ms=300, rebuild=False)
    done = BatchFutures(pool)
    gate = threading.Event()
    try:
        faults.inject("execute", nth=1, hold=gate)
        hung = done.submit([affine_request(1)], 1)
        traced_future: concurrent.futures.Future = concurrent.futures.Future()
        traced = Batch([affine_request(1, 5)], 1, 1, None, requests=(traced_future,))
        traced.trace = BatchTrace("affine", 1, 1, 1, {2: 1}, now_ns())  # its launch anchors the clock
        pool.submit(traced)  # BatchFutures, the pool's listener, settles its future
        with pytest.raises(DeviceTimeout):
            hung.result(timeout=30)
        with pytest.raises(DeviceTimeout):
            traced_future.result(timeout=30)  # a hang guard: it used to take 60 s
        assert "trace clock not anchored" in caplog.text
    finally:
        gate.set()
        pool.close()


def test_a_timed_out_batch_is_retried_on_another_instance(runtime, affine_om):
    pool = open_pool(runtime, affine_om(), "affine", instances=2, execution_timeout_ms=100)
    short_timeout_only_on(pool, lane=0)  # the retry on affine#1 gets a generous one
    done = BatchFutures(pool)
    gate = threading.Event()
    hung = pool.instances[0]
    try:
        faults.inject("execute", nth=1, hold=gate)
        result = done.submit([affine_request(2, 3)], 2, lane=0).result(timeout=30)
        np.testing.assert_array_equal(result.outputs[0]["s"], affine_request(2, 3)["idx"] * 2)
        # on affine#1, or on affine#0 rebuilt when that came first (one CI run): not the hung one
        assert pool.batch_faults.reruns == 1 and pool.batch_faults.outcomes()["retried"] == 1
        assert result.instance == "affine#1" or pool.instances[0] is not hung
    finally:
        gate.set()
        pool.close()


@pytest.mark.usefixtures("clean_faults")
def test_a_static_models_run_is_timed_too(runtime, affine_om):
    """A static model's warm-up recorded no cost: its execution timeout took the 2 s floor (a
    model running 2.7 s a batch failed every request, its instance rebuilt each time) and its
    auto queue deadline too (a 194 ms model's queued requests 503 after 2 s). Found by a review."""
    from aclserve.config import ModelConfig
    from aclserve.repository import overload
    from aclserve.runtime.warmup import STATIC_RUN
    pool = open_pool(runtime, affine_om(batch="1"), "affine")
    try:
        assert pool.gears == ()
        faults.inject("execute", delay_ms=40)  # a slow model: every warm-up run takes 40 ms or more
        warm_up(pool)
        faults.clear()
        assert list(pool.gear_cost) == [STATIC_RUN] and pool.gear_cost[STATIC_RUN] >= 0.04
        assert pool.set_execution_timeout(0) == round(pool.gear_cost[STATIC_RUN] * 1e5) >= 4000
        policy = overload.resolve(ModelConfig(), pool.gears, pool.gear_cost, 1).batching.default_queue_policy
        assert policy.max_queue_size == overload.MIN_QUEUE
        assert policy.default_timeout_ms >= 2 * overload.MIN_QUEUE * 40  # the full queue's 64 runs, twice
    finally:
        pool.close()


def test_the_execution_timeout_follows_the_measured_gear_cost_between_a_floor_and_a_ceiling(runtime, affine_om):
    pool = open_pool(runtime, affine_om(), "affine")
    try:
        warm_up(pool)
        assert pool.set_execution_timeout(0) == max(TIMEOUT_FLOOR_MS, round(max(pool.gear_cost.values()) * 1e5))
        # at most the ceiling, under the device's AI CPU op timeout; a gear slower than a third of it gets 3 runs
        pool.gear_cost[max(pool.gear_cost)] = 0.5
        assert pool.set_execution_timeout(0) == TIMEOUT_CEILING_MS
        pool.gear_cost[max(pool.gear_cost)] = 10.0
        assert pool.set_execution_timeout(0) == 30_000
        assert pool.set_execution_timeout(250) == 250
        assert [i.execution_timeout_ms for i in pool.instances] == [250]
    finally:
        pool.close()


def test_an_execution_timeout_set_while_an_instance_is_rebuilt_reaches_the_rebuilt_instance(runtime, affine_om):
    """set_execution_timeout() (the repository's, after warm-up) while a rebuild builds: the
    rebuilt instance kept the value its build had started with, missed by the instances set."""
    pool = open_pool(runtime, affine_om(), "affine", execution_timeout_ms=100)
    done = BatchFutures(pool)
    gate, building = threading.Event(), threading.Event()
    try:
        faults.inject("execute", nth=1, hold=gate)
        load = faults.inject("query_size", nth=1, hold=building)  # the rebuild's model load
        with pytest.raises(DeviceTimeout):
            done.submit([affine_request(1)], 1).result(timeout=30)
        assert load.entered.wait(30)  # building, with the pool's 100 ms
        pool.set_execution_timeout(GENEROUS_TIMEOUT_MS)
        building.set()
        assert done.submit([affine_request(1, 2)], 1).result(timeout=30).instance == "affine#0"  # the rebuilt one
        assert [i.execution_timeout_ms for i in pool.instances] == [GENEROUS_TIMEOUT_MS]
    finally:
        gate.set()
        building.set()
        pool.close()


def test_stale_rebuild_copies_go_and_live_ones_stay(tmp_path, monkeypatch):
    """A copy a process left behind, killed during a rebuild, goes with the next copy made; one
    another process is loading (it holds its lock) stays, whatever its pid means here (a pid
    check took a live copy of another PID namespace sharing the folder for a dead one)."""
    import fcntl
    from aclserve.runtime import kept_file
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    stale, live = tmp_path / "aclserve-rebuild-m-1.om", tmp_path / "aclserve-rebuild-m-2.om"
    stale.write_bytes(b"x" * 100)
    live.write_bytes(b"y" * 100)
    with open(live, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        kept_file._delete_stale_copies()
        assert not stale.exists() and live.exists()
