"""Which load failures are transient, retried on the backoff schedule (a device or the host running
short), and which are refused for good; a valid model's load short of host memory is transient
however it fails."""
from __future__ import annotations

import random

import numpy as np

from aclserve.acl.check import AclError
from aclserve.errors import ExecutionFailed
from aclserve.repository.retry import RetrySchedule, is_transient
from aclserve.runtime.device import LoadError


def test_backoff_doubles_up_to_the_ceiling_with_jitter_in_its_upper_half():
    schedule = RetrySchedule(1.0, 8.0, lambda *a: None, rng=random.Random(3))
    for attempt, ceiling in enumerate([1, 2, 4, 8, 8, 8]):
        delays = {schedule.delay(attempt) for _ in range(20)}
        assert all(ceiling / 2 <= d <= ceiling for d in delays) and len(delays) > 1
    assert 4 <= schedule.delay(5000) <= 8  # a model that failed all week still retries at the ceiling


def test_only_device_and_resource_failures_are_transient():
    assert is_transient(ExecutionFailed("batch failed on device 0"))
    assert is_transient(AclError("rt.malloc", 207001)) and is_transient(AclError("mdl.execute", 507011))
    assert not is_transient(AclError("mdl.load_from_file", 145006))  # wrong kind of file
    assert not is_transient(ValueError("not an OM file"))
    # a warm-up batch: GE refusing the run for what it was given (145xxx) refuses it again; an unknown
    # model id (145003) is what a run meets when its model is unloaded under it
    for ret, transient in ((507011, True), (145000, False), (145013, False), (145003, True)):
        batch = ExecutionFailed("batch of 4 rows (gear 4) failed on device 0")
        batch.__cause__ = AclError("rt.synchronize_event_with_timeout", ret)
        assert is_transient(batch) is transient, ret
    # a load's own call (the model's memory, its load): the cause decides (om_model.py keeps it)
    for ret, transient in ((207001, True), (245000, True), (507899, True), (145000, False), (500002, False),
                           (207000, False), (200001, False)):
        try:
            try:
                raise AclError("mdl.load_from_file_with_mem", ret)
            except AclError as e:
                raise LoadError(f"model m: loading m.om failed ({e})") from e
        except LoadError as load_error:
            assert is_transient(load_error) is transient, ret
    assert not is_transient(LoadError("model m: 2,000,000 bytes would leave less than the reserve"))


def test_the_host_running_short_is_transient():
    """A full disk under the compile cache, no thread to be had, host memory: each failed the
    model for good, though nothing was wrong with its file (found by running the server short
    of each); freed, nothing loaded it until the file was touched."""
    import errno
    for error in (OSError(errno.ENOSPC, "No space left on device"), MemoryError(),
                  RuntimeError("can't start new thread"), OSError(errno.EMFILE, "Too many open files")):
        try:
            try:
                raise error
            except BaseException as e:
                raise LoadError("model m: loading failed") from e
        except LoadError as wrapped:
            assert is_transient(error) and is_transient(wrapped), error
    assert not is_transient(OSError(errno.EACCES, "Permission denied"))
    try:  # the file checks hide the OSError they turn into "cannot read the file" (`from None`)
        try:
            raise OSError(errno.EMFILE, "Too many open files")
        except OSError:
            raise ValueError("cannot read the file: Too many open files") from None
    except ValueError as hidden:
        assert is_transient(hidden)
    assert not is_transient(RuntimeError("instances of one pool loaded different models"))


LOAD_UNDER_A_MEMORY_LIMIT = """
import resource, sys
from aclserve.repository.retry import is_transient
from aclserve.runtime import AclRuntime, open_pool
rt = AclRuntime(device="cpu").start()
vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + int(sys.argv[2]) * (1 << 20), resource.RLIM_INFINITY))
try:
    open_pool(rt, sys.argv[1], "big", instances=1).close()
    print("loaded")
except Exception as e:
    print("transient" if is_transient(e) else f"refused for good: {e}")
"""


def test_a_load_short_of_host_memory_is_transient_however_it_fails(tmp_path):
    """Under a memory limit a valid model's load fails in Python (MemoryError), in a thread's
    start, or inside ONNX Runtime (std::bad_alloc), which the CPU runtime answered 145006, "not a
    loadable OM file": refused for good (found by a review, under `ulimit -v`). Whichever way it
    fails here, it must be retried; with room enough it loads."""
    import subprocess
    import sys

    from onnx import TensorProto, helper, numpy_helper

    from tests.tiny_models import compile_cpu_om, save_graph
    n = 3000  # 36 MB of weights
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", n])],
        [numpy_helper.from_array(np.zeros((n, n), np.float32), "w")])
    om = compile_cpu_om(save_graph(graph, tmp_path / "big.onnx"), tmp_path / "big.om", batch="1")
    said = []
    for extra_mb in (60, 120, 180, 240, 300, 400, 600, 4000):
        proc = subprocess.run([sys.executable, "-c", LOAD_UNDER_A_MEMORY_LIMIT, om, str(extra_mb)],
                              capture_output=True, text=True, timeout=120)
        said.append(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-300:])
    assert all(s in ("transient", "loaded") for s in said), said
    assert said[-1] == "loaded", said
