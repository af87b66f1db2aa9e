"""CPU-runtime fault injection: "fail the next N", memcpy faults (sync and on a stream), and a
bad ACLSERVE_CPU_FAULTS spec reported in one line (also by `aclserve serve`, before start-up)."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from aclserve.acl import constants as C
from aclserve.acl.cpu import faults

from .conftest import mlp_onnx, write_cpu_om

H2D = 1


def test_nth_and_count_pick_a_run_of_calls(clean_faults):
    faults.inject("execute", nth=2, count=3)
    codes = [faults.trigger("execute", 1) for _ in range(6)]
    assert codes == [0] + [C.ACL_ERROR_RT_MODEL_EXECUTE] * 3 + [0, 0]
    faults.clear()
    faults.inject("execute", count=2, code=507000)
    assert [faults.trigger("execute", 1) for _ in range(3)] == [507000, 507000, 0]


def test_memcpy_faults_fail_sync_copies_and_surface_at_synchronize(acl, ctx, device_buffer, host_buffer, cpu_only,
                                                                  clean_faults):
    src = host_buffer(64)  # memcpy_async's host side is pinned memory
    dev = device_buffer(64)
    faults.inject("memcpy", count=1)
    assert acl.rt.memcpy(dev, 64, src, 64, H2D) == C.ACL_ERROR_RT_MODEL_EXECUTE
    assert acl.rt.memcpy(dev, 64, src, 64, H2D) == 0
    stream, ret = acl.rt.create_stream()
    assert ret == 0
    try:
        faults.inject("memcpy", count=1, code=507000)
        assert acl.rt.memcpy_async(dev, 64, src, 64, H2D, stream) == 0  # queued; fails on the stream
        assert acl.rt.synchronize_stream(stream) == 507000
        assert acl.rt.memcpy_async(dev, 64, src, 64, H2D, stream) == 0
        assert acl.rt.synchronize_stream(stream) == 0
    finally:
        acl.rt.destroy_stream(stream)


def test_a_delay_may_keep_code_0():
    assert faults.parse("execute:nth=2,delay_ms=5,code=0") == [{"kind": "execute", "nth": 2, "delay_ms": 5.0,
                                                                 "code": 0}]


@pytest.mark.parametrize("spec, fragment", [
    ("execute:nth=abc", "nth must be an integer, got 'abc'"),
    ("gpu:nth=1", "unknown kind 'gpu'"),
    ("execute:nth=0", "nth must be >= 1"),
    ("execute:probability=2", "probability must be within 0..1"),
    ("execute:nth", "unknown item 'nth'"),
    ("execute:delay_ms=-5", "delay_ms must be >= 0"),
    # time.sleep cannot take them: every execution failed with a traceback, the load retried for good
    ("execute:delay_ms=1e400", "delay_ms must be a finite number of milliseconds"),
    ("execute:delay_ms=nan", "delay_ms must be a finite number of milliseconds"),
    ("execute:delay_ms=-inf", "delay_ms must be a finite number of milliseconds"),
    ("execute:delay_ms=1e300", "delay_ms must be at most"),
    ("execute:probability=nan", "probability must be within 0..1"),
    # accepted in silence (an attacker's re-test): the second nth won, code 0 injected nothing
    ("execute:nth=1,nth=2", "nth given twice"),
    ("execute:code=0", "code must be an ACL error code (a positive number, at most 2147483647: aclError is a C int; "
                       "0 only with a delay_ms), got 0"),
    ("execute:code=-1", "code must be an ACL error code"),
    # taken, though pyACL returns no code past a C int (a tester)
    ("execute:code=99999999999999999999", "at most 2147483647: aclError is a C int; 0 only with a delay_ms), "
                                          "got 99999999999999999999"),
    ("memcpy:code=2147483648", "got 2147483648"),
    # taken, though no model has an id past a uint32 (or below 0): the fault never fired
    ("execute:model_id=4294967296", "model_id must be a model id (0..4294967295: a uint32), got 4294967296"),
    ("describe:model_id=-1", "model_id must be a model id (0..4294967295: a uint32), got -1"),
    # taken: a memcpy names no model, so the fault never fired; a load, query_size or mem_info passes
    # model 0, so model_id=0 failed every one of them
    ("memcpy:model_id=1", "model_id=1 is for the kinds execute, execute_call, describe: a 'memcpy' call names no "
                          "model"),
    ("load:model_id=0", "model_id=0 is for the kinds execute, execute_call, describe: a 'load' call names no model"),
    ("query_size:nth=1,model_id=0", "a 'query_size' call names no model"),
    ("mem_info:model_id=3", "a 'mem_info' call names no model"),
    ("dvpp:model_id=3", "a 'dvpp' call names no model"),
    ("memcpy:model=double", "model=double is for the kinds execute, execute_call, describe, load: a 'memcpy' call "
                            "names no model"),
    ("execute:model=", "model must be a model's name, got none"),
    # a stream fault delays every task of every stream: failing an event's record is no device's failure
    ("stream:delay_ms=1,code=507011", "a stream fault delays (delay_ms) every task a stream runs; it takes no code "
                                      "(its tasks do not fail), got code=507011"),
    ("stream:probability=0.5", "got no delay_ms"),
    # what a device says of a failed task: a copy's, a delay's would say it of no failure
    ("memcpy:says=1", "says=1 is for a failing execute (a code), not 'memcpy'"),
    ("execute:delay_ms=5,says=1", "says=1 is for a failing execute (a code), not 'execute' without one"),
    ("execute:says=2", "says must be 0 or 1, got 2"),
])
def test_a_bad_spec_is_one_line_naming_the_problem(spec, fragment):
    with pytest.raises(ValueError) as info:
        faults.parse(spec)
    message = str(info.value)
    assert "\n" not in message and message.startswith("ACLSERVE_CPU_FAULTS: ") and fragment in message
    assert "format: kind[:key=value" in message


def test_a_delay_time_can_sleep_is_taken(clean_faults):
    faults.inject("execute", nth=1, delay_ms=faults.MAX_DELAY_MS)  # checked, never run
    assert faults.parse("execute:code=2147483647") == [{"kind": "execute", "code": 2147483647}]
    assert faults.parse("execute:model_id=4294967295") == [{"kind": "execute", "model_id": 4294967295}]
    with pytest.raises(ValueError, match="model_id must be a model id"):  # inject() checks it too
        faults.inject("execute", model_id=2**32)
    with pytest.raises(ValueError, match="a 'memcpy' call names no model"):
        faults.inject("memcpy", model_id=1)
    for kind in faults.MODEL_KINDS:
        assert faults.parse(f"{kind}:model_id=7") == [{"kind": kind, "model_id": 7}]
    assert faults.parse("execute:delay_ms=0.5") == [{"kind": "execute", "delay_ms": 0.5}]


def test_a_stream_fault_holds_every_task_a_stream_runs_an_event_record_included(acl, ctx, cpu_only, clean_faults):
    """`stream` widens the windows between a call and its task (where a host touching a buffer an
    async copy owns is caught): a delay or hold of each task as it starts, markers included."""
    assert faults.parse("stream:delay_ms=2,probability=0.3") == [{"kind": "stream", "delay_ms": 2.0,
                                                                 "probability": 0.3}]
    stream, _ = acl.rt.create_stream()
    event, _ = acl.rt.create_event()
    gate = threading.Event()
    try:
        held = faults.inject("stream", nth=1, hold=gate)
        assert acl.rt.record_event(event, stream) == 0
        assert held.entered.wait(30)
        assert acl.rt.query_event_status(event) == (C.ACL_EVENT_RECORDED_STATUS_NOT_READY, 0)
        gate.set()
        assert acl.rt.synchronize_event(event) == 0
        assert acl.rt.record_event(event, stream) == 0  # the fault was for one task
        assert acl.rt.synchronize_event(event) == 0
    finally:
        gate.set()
        assert acl.rt.destroy_event(event) == 0
        assert acl.rt.destroy_stream(stream) == 0


@pytest.mark.parametrize("spec, fragment", [("execute:nth=x", "nth must be an integer"),
                                            ("execute:delay_ms=1e400", "delay_ms must be a finite number"),
                                            ("memcpy:model_id=1", "model_id=1 is for the kinds execute, execute_call, "
                                                                  "describe: a 'memcpy' call names no model")])
def test_serve_with_a_bad_spec_exits_with_one_line(tmp_path, spec, fragment):
    env = dict(os.environ, ACLSERVE_CPU_FAULTS=spec)
    proc = subprocess.run([sys.executable, "-m", "aclserve", "serve", "--models", str(tmp_path), "--port", "0",
                           "--grpc-port", "0", "--device", "cpu"], env=env, capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and fragment in lines[0], proc.stderr


KEY = "0123456789abcdef" * 2  # 32 hex digits: what the server's compile-cache entries carry after "-"


@pytest.mark.parametrize("name, matched", [
    ("double", True), (f"double-{KEY}", True),  # its own OM; the server's compile of it (<model>-<key>)
    ("double2", False), (f"double-{KEY[:31]}", False), (f"double-{KEY}0", False), (f"double-{KEY.upper()}", False),
    (f"double-x-{KEY}", False), ("other-double", False), ("", False)])
def test_a_model_scope_names_the_model_and_its_compile_cache_entries(name, matched):
    assert faults.names_model(name, "double") is matched


def test_model_scoped_faults_follow_the_models_name_not_its_id(acl, ctx, tmp_path, cpu_only, clean_faults):
    """model_id= stopped matching once the model was loaded again (a rebuild, a reload or a retry
    gets a new id): model= matches the name its OM's header gives, at every load, from a file or memory."""
    mlp = write_cpu_om(tmp_path / "mlp.om", mlp_onnx(), [1, 2])
    other_model = mlp_onnx()
    other_model.graph.name = "mlp-other"  # (the header's name: write_cpu_om's graph name)
    other = write_cpu_om(tmp_path / "other.om", other_model, [1, 2])
    faults.inject(**faults.parse("load:model=mlp,count=2,code=207001")[0])
    loaded = []
    try:
        other_id, ret = acl.mdl.load_from_file(other)
        loaded.append(other_id)
        assert ret == 0
        assert acl.mdl.load_from_file(mlp)[1] == C.ACL_ERROR_RT_MEMORY_ALLOCATION
        data = Path(mlp).read_bytes()
        assert acl.mdl.load_from_mem(acl.util.bytes_to_ptr(data), len(data))[1] == C.ACL_ERROR_RT_MEMORY_ALLOCATION
        mlp_id, ret = acl.mdl.load_from_file(mlp)  # (the count spent)
        loaded.append(mlp_id)
        assert ret == 0
        faults.inject(**faults.parse("describe:model=mlp,count=2")[0])
        failed = C.ACL_ERROR_RT_MODEL_EXECUTE
        for model_id, code in ((other_id, 0), (mlp_id, failed), (mlp_id, failed), (mlp_id, 0)):
            desc = acl.mdl.create_desc()
            try:
                assert acl.mdl.get_desc(desc, model_id) == code
            finally:
                acl.mdl.destroy_desc(desc)
    finally:
        for model_id in loaded:
            acl.mdl.unload(model_id)
