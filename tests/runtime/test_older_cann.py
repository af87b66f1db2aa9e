"""The server's fallbacks for what an older CANN release or a SoC lacks (acl/compat.py), and its
serving on the board (ACL_DEVICE), run on the real CPU runtime presenting that CANN:
ACLSERVE_CPU_LACKS leaves calls out of its modules as an older pyACL has not got them,
ACLSERVE_CPU_SOC=Ascend310 refuses a timed event wait and set_stream_failure_mode as that SoC does,
ACLSERVE_CPU_RUN_MODE=device gives host memory that is not 64-byte aligned. Each case in a
process of its own: the CPU runtime reads them when ACL starts."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests import REPO

SCRIPT = r'''
import json, logging, sys, threading
import numpy as np
from aclserve.acl import AclError, compat, using_context
from aclserve.acl import constants as C
from aclserve.acl.cpu import faults
from aclserve.errors import ExecutionFailed
from aclserve.runtime import AclRuntime, open_pool
from aclserve.runtime.futures import BatchFutures
from tests.tiny_models import affine_reference, affine_request

said = []
handler = logging.Handler()
handler.emit = lambda record: said.append(record.getMessage())
logging.getLogger("aclserve").addHandler(handler)
case, om = sys.argv[1], sys.argv[2]
out = {}
with AclRuntime("cpu") as runtime:
    acl = runtime.acl
    out["has"] = {name: hasattr(acl.rt, name) for name in ("synchronize_event_with_timeout",
                  "synchronize_stream_with_timeout", "create_event_ex_with_flag")}
    out["soc"] = compat.soc_name(acl)
    out["run_mode"] = acl.rt.get_run_mode()[0]
    with using_context(acl, runtime.device(0).context):
        block, _ = acl.rt.malloc_host(100)
        out["host_align"] = block % 64
        assert acl.rt.free_host(block) == 0
        stream, _ = acl.rt.create_stream()
        event, _ = acl.rt.create_event()
        assert acl.rt.record_event(event, stream) == 0
        for _ in range(2):
            compat.synchronize_event(acl, event, 10)
            compat.synchronize_stream(acl, stream, 10)
        if case == "ascend310":  # its stream waits stay timed: a held stream's wait times out
            pool = open_pool(runtime, om, "held")
            gate = threading.Event()
            held = faults.inject("execute", nth=1, hold=gate)
            try:
                future = BatchFutures(pool).submit([affine_request(1)], 1)
                held.entered.wait(30)
                stream_of_batch = pool.instances[0].streams["compute"]
                with using_context(acl, pool.instances[0].context):
                    try:
                        compat.synchronize_stream(acl, stream_of_batch, 50)
                        out["stream_wait"] = "returned"
                    except AclError as e:
                        out["stream_wait"] = e.ret
            finally:
                gate.set()
                future.result(30)
                faults.clear()
                pool.close()
        assert acl.rt.destroy_event(event) == 0
        assert acl.rt.destroy_stream(stream) == 0
    pool = open_pool(runtime, om, "failing", slots=2, retry=False)  # a failed execution, answered how?
    try:
        out["slots"] = len(pool.instances[0].slots)
        done = BatchFutures(pool)
        faults.inject("execute", nth=1)
        try:
            done.submit([affine_request(1)], 1).result(30)
            out["failed_batch"] = "answered as a success"
        except ExecutionFailed as e:
            out["failed_batch"] = str(e)
        faults.clear()
        request = affine_request(2, first_id=7)
        result = done.submit([request], 2).result(30)
        out["after"] = bool(np.allclose(result.outputs[0]["y"], affine_reference(**request)["y"], rtol=1e-5))
        out["rebuilds"] = pool.rebuilds
    finally:
        pool.close()
    host_before = acl.memory_stats(0)["host_used"]
    pool = open_pool(runtime, om, "affine", slots=2)
    try:
        out["cross_stream"] = [slot.cross_stream for slot in pool.instances[0].slots]
        done = BatchFutures(pool)
        requests = [affine_request(rows, first_id=10 * i) for i, rows in enumerate([1, 2, 3, 4] * 8)]
        futures = [done.submit([request], 4) for request in requests]  # gear 4: 1-4 rows, two slots
        out["own_rows"] = all(np.allclose(f.result(30).outputs[0]["y"], affine_reference(**r)["y"], rtol=1e-5)
                              for r, f in zip(requests, futures))
    finally:
        pool.close()
    out["host_kept"] = acl.memory_stats(0)["host_used"] - host_before  # the slots' host blocks all freed
out["said"] = said
print(json.dumps(out))
'''


def run(case: str, om: str, **env) -> dict:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, case, om], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, **env), timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def said(out: dict, words: str) -> int:
    return sum(words in line for line in out["said"])


def test_a_cann_without_timed_waits_waits_untimed_and_serves(affine_om):
    out = run("untimed", affine_om(), ACLSERVE_CPU_LACKS="rt.synchronize_event_with_timeout,"
              "rt.synchronize_stream_with_timeout,get_soc_name")
    assert out["has"] == {"synchronize_event_with_timeout": False, "synchronize_stream_with_timeout": False,
                          "create_event_ex_with_flag": True}
    assert out["soc"] is None
    assert out["own_rows"] and out["cross_stream"] == [True, True]
    for call in ("synchronize_event_with_timeout", "synchronize_stream_with_timeout"):
        assert said(out, f"this CANN has no acl.rt.{call}: waiting without a timeout") == 1


def test_an_ascend310_waits_for_events_untimed_and_for_streams_timed(affine_om):
    """The CPU runtime presenting an Ascend310 refuses a timed event wait (CANN: -1 only), so an
    event wait that returns took the plain call; a stream held by a fault times out, so stream
    waits stay timed."""
    out = run("ascend310", affine_om(), ACLSERVE_CPU_SOC="Ascend310")
    assert out["soc"] == "Ascend310"
    assert out["stream_wait"] == 507046  # ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
    assert out["own_rows"]
    assert said(out, "the Ascend310 cannot time an event wait") == 1
    assert not [line for line in out["said"] if "stream wait" in line]


def test_a_cann_without_create_event_ex_with_flag_keeps_each_batch_on_one_stream(affine_om):
    """The slots get plain events, which CANN lets another stream wait on only as record, wait,
    reset: every batch then runs on the compute stream alone (the CPU runtime refuses a plain
    event's second record after a wait, so a piped batch would fail). Many batches in flight
    on two slots, each answered with its own rows; said once."""
    out = run("no_flagged_events", affine_om(), ACLSERVE_CPU_LACKS="rt.create_event_ex_with_flag")
    assert out["has"]["create_event_ex_with_flag"] is False
    assert out["cross_stream"] == [False, False]
    assert out["own_rows"]
    assert said(out, "no acl.rt.create_event_ex_with_flag: each batch runs") == 1


def test_on_the_board_host_buffers_are_aligned_for_the_copies(affine_om):
    """On the board malloc_host's memory need not be 64-byte aligned (CANN), which memcpy_async
    asks of both addresses: the slots align their staging buffers inside a larger block, so every
    batch's copies go through (the CPU runtime refuses an unaligned memcpy_async)."""
    out = run("board", affine_om(), ACLSERVE_CPU_RUN_MODE="device")
    assert out["run_mode"] == 0 and out["host_align"] == 16  # ACL_DEVICE; 16-byte aligned only
    assert out["own_rows"] and out["cross_stream"] == [True, True]
    assert out["host_kept"] == 0


# What the board changes is malloc_host's memory (its alignment; the device's own) and get_run_mode.
# Left out of the board's run (half its time), as it would run them to the same end: the contract
# test that runs three of its tests in a board's process (run here already), and those whose
# processes of their own touch no host memory (VPC output heights, JPEGD strides: DVPP memory alone; a serve
# refusing its fault spec, which exits before any memory is taken; streams' and events' limits).
OFF_THE_BOARD = ["tests/contract/test_acl_model.py::test_the_board_takes_malloc_host_memory_as_device_memory",
                 "tests/contract/test_acl_media.py::test_vpc_output_height_and_jpegd_stride_follow_the_soc",
                 "tests/contract/test_acl_faults.py::test_serve_with_a_bad_spec_exits_with_one_line",
                 "tests/contract/test_acl_event_resources.py"]


def test_the_contract_tests_hold_on_the_board():
    """tests/contract (what a device refuses, the CPU runtime refuses) with the CPU runtime
    presenting a board, whose malloc_host memory is 16-byte aligned only: the tests' async copies
    stage host memory from its first aligned byte, as the slots do (before, most failed there)."""
    deselect = [option for test in OFF_THE_BOARD for option in ("--deselect", test)]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/contract", *deselect],
                          cwd=REPO, env=dict(os.environ, ACLSERVE_CPU_RUN_MODE="device"), capture_output=True,
                          text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout[-3000:]


@pytest.mark.parametrize("soc, untimed", [("Ascend310", True), ("Ascend310P3", False), ("Ascend310B1", False),
                                           ("Ascend910B2", False), (None, False)])
def test_which_socs_wait_for_events_forever_only(soc, untimed):
    from aclserve.acl import compat
    assert compat.event_waits_forever_only(soc) is untimed


def test_a_bad_lacks_setting_leaves_the_runtime_uninitialised():
    """acl.init reads ACLSERVE_CPU_LACKS before it initialises anything: a bad value is refused
    and a later init (the setting mended) starts the runtime, not a repeated init (100002)."""
    script = r'''
import os
from aclserve.acl import cpu as acl
try:
    acl.init()
except ValueError as e:
    print("refused:", "ACLSERVE_CPU_LACKS names" in str(e))
del os.environ["ACLSERVE_CPU_LACKS"]
print("init", acl.init(), "finalize", acl.finalize())
'''
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, ACLSERVE_CPU_LACKS="rt.no_such_call"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["refused:", "True", "init", "0", "finalize", "0"]


@pytest.mark.parametrize("env, stops", [
    ({}, True),
    ({"ACLSERVE_CPU_LACKS": "rt.set_stream_failure_mode"}, False),
    ({"ACLSERVE_CPU_SOC": "Ascend310"}, False),
    ({"ACLSERVE_CPU_LACKS": "rt.stream_abort"}, True),
], ids=["stop-on-failure", "no-failure-mode", "ascend310", "no-stream-abort"])
def test_a_failed_execution_is_never_answered_as_a_success(affine_om, env, stops):
    """In CANN's default mode an event recorded after a failed execution completes and its
    synchronize returns 0 (the CPU runtime does the same), so a batch's events alone answered a
    failed execution with whatever its output buffers held. Where streams can stop on a failure
    (compat.stop_on_failure) the event reports it, and the instance, whose context takes no task
    again, is rebuilt; where they cannot (an older CANN, the Atlas 200/300/500) the instance has
    one slot and its streams are synchronized after each batch. Either way the batch fails with
    the device's code and the model serves on."""
    out = run("failures", affine_om(), **env)
    assert "507011" in out["failed_batch"], out["failed_batch"]
    assert out["after"]
    assert out["slots"] == (2 if stops else 1)
    assert out["rebuilds"] == (1 if stops else 0)
    # the stopped instance's close aborts its streams, or says once that it cannot
    assert said(out, "stream_abort") == (env.get("ACLSERVE_CPU_LACKS") == "rt.stream_abort")
    if not stops:
        assert said(out, "set_stream_failure_mode") == 1  # said once, for all the instances


@pytest.mark.parametrize("soc, code", [("Ascend910B1", 0), ("Ascend910B3", 0), ("Ascend910_9391", 0),
                                       ("Ascend310P3", 207000), ("Ascend910", 207000), ("Ascend910B", 207000)])
def test_stream_abort_is_taken_on_the_a2_and_a3_series_only(soc, code):
    """CANN's aclrtStreamAbort page: the A2/A3 series take it, the Atlas inference (310P) and
    training (910) series do not, the training series' Ascend910B included (its name's beginning
    took it for an A2's, Ascend910B1..B4)."""
    script = r'''
from aclserve.acl import cpu as acl
acl.init()
assert acl.rt.set_device(0) == 0
context, _ = acl.rt.create_context(0)
stream, _ = acl.rt.create_stream()
print(acl.rt.stream_abort(stream))
acl.rt.destroy_stream(stream)
acl.rt.destroy_context(context)
acl.rt.reset_device(0)
acl.finalize()
'''
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, ACLSERVE_CPU_SOC=soc), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.split()[-1]) == code
