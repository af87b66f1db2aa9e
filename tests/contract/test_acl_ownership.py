"""What belongs to a context stays with it, and arguments are parsed like pyACL's C extension.

Streams and model ids belong to the context current when they were created or loaded: work on
them under another context of the same device fails with 107003 ("stream not in current
context") or 107004 ("model not in current context"); a stream's synchronize does not (CANN's
StreamSynchronize switches to the stream's context and back). Pointer and size arguments are C unsigned
longs ("k"/"K"): only a real int passes. These run on a real Ascend host too.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from aclserve.acl import constants as C


@pytest.fixture
def other_ctx(acl, ctx):
    """A second context on device 0; the test starts with `ctx` current again."""
    other, ret = acl.rt.create_context(0)
    assert ret == 0
    assert acl.rt.set_context(ctx) == 0
    yield other
    assert acl.rt.destroy_context(other) == 0
    assert acl.rt.set_context(ctx) == 0


def test_stream_used_under_another_context_of_the_same_device_gets_107003(acl, ctx, other_ctx, device_buffer,
                                                                          host_buffer):
    stream, ret = acl.rt.create_stream()
    assert ret == 0
    event, ret = acl.rt.create_event()
    assert ret == 0
    dev = device_buffer(64)
    host = host_buffer(64)
    try:
        assert acl.rt.set_context(other_ctx) == 0
        # a synchronize is not refused: CANN switches to the stream's context and back
        assert acl.rt.synchronize_stream(stream) == 0
        assert acl.rt.synchronize_stream_with_timeout(stream, 1000) == 0
        assert acl.rt.get_context() == (other_ctx, 0)
        assert acl.rt.memcpy_async(dev, 64, host, 64, C.ACL_MEMCPY_HOST_TO_DEVICE, stream) \
            == C.ACL_ERROR_RT_STREAM_CONTEXT
        assert acl.rt.record_event(event, stream) == C.ACL_ERROR_RT_STREAM_CONTEXT
        assert acl.rt.stream_wait_event(stream, event) == C.ACL_ERROR_RT_STREAM_CONTEXT
        assert acl.rt.destroy_stream(stream) == C.ACL_ERROR_RT_STREAM_CONTEXT
        # the same calls succeed back under the owning context
        assert acl.rt.set_context(ctx) == 0
        assert acl.rt.memcpy_async(dev, 64, host, 64, C.ACL_MEMCPY_HOST_TO_DEVICE, stream) == 0
        assert acl.rt.record_event(event, stream) == 0
        assert acl.rt.synchronize_stream(stream) == 0
    finally:
        assert acl.rt.set_context(ctx) == 0
        assert acl.rt.destroy_event(event) == 0
        assert acl.rt.destroy_stream(stream) == 0


def test_model_executed_under_another_context_gets_107004(acl, ctx, other_ctx, loaded_mlp):
    m = loaded_mlp
    idx = acl.mdl.get_input_index_by_name(m.desc, C.ACL_DYNAMIC_TENSOR_NAME)[0]
    assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, idx, 1) == 0
    assert acl.rt.set_context(other_ctx) == 0
    try:
        stream, ret = acl.rt.create_stream()
        assert ret == 0
        assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == C.ACL_ERROR_RT_MODEL_CONTEXT
        assert acl.mdl.execute_async(m.model_id, m.inputs, m.outputs, stream) == C.ACL_ERROR_RT_MODEL_CONTEXT
        assert acl.rt.destroy_stream(stream) == 0
    finally:
        assert acl.rt.set_context(ctx) == 0
    assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == 0  # the loading context still works


def test_model_unloaded_under_another_context_is_refused_on_the_cpu_runtime(acl, ctx, other_ctx, loaded_mlp,
                                                                            cpu_only):
    """Stricter than the device, on purpose: GE's unload under another context (or none) reports
    success but leaves the model's own streams, events and rtModel undestroyed (DavinciModel's
    destructor destroys them only under a current context, and a stream destroy under another
    fails and is only logged): a leak no test would see. The CPU runtime refuses it (107004), so
    an unload in the wrong context fails where the tests run."""
    assert acl.rt.set_context(other_ctx) == 0
    try:
        assert acl.mdl.unload(loaded_mlp.model_id) == C.ACL_ERROR_RT_MODEL_CONTEXT
    finally:
        assert acl.rt.set_context(ctx) == 0
    m = loaded_mlp
    idx = acl.mdl.get_input_index_by_name(m.desc, C.ACL_DYNAMIC_TENSOR_NAME)[0]
    assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, idx, 1) == 0
    assert acl.mdl.execute(m.model_id, m.inputs, m.outputs) == 0  # still loaded, in its context


def test_a_thread_with_another_context_cannot_run_the_model(acl, ctx, other_ctx, loaded_mlp):
    """The launcher-thread shape of the bug: load in one context, execute from a thread bound to another."""
    import threading

    m = loaded_mlp
    result = {}

    def worker():
        assert acl.rt.set_context(other_ctx) == 0
        result["ret"] = acl.mdl.execute(m.model_id, m.inputs, m.outputs)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert result["ret"] == C.ACL_ERROR_RT_MODEL_CONTEXT


@pytest.mark.parametrize("call", [
    lambda acl, p: acl.rt.malloc(np.int64(64), C.ACL_MEM_MALLOC_NORMAL_ONLY),
    lambda acl, p: acl.rt.malloc_host(np.uint64(64)),
    lambda acl, p: acl.rt.memcpy(p, np.int64(64), p, 64, C.ACL_MEMCPY_DEVICE_TO_DEVICE),
    lambda acl, p: acl.rt.memcpy(p, 64, p, np.int32(64), C.ACL_MEMCPY_DEVICE_TO_DEVICE),
    lambda acl, p: acl.rt.memset(p, 64, 0, np.int64(64)),
    lambda acl, p: acl.rt.free(np.int64(p)),
    lambda acl, p: acl.create_data_buffer(p, np.int64(64)),
])
def test_numpy_integers_as_pointers_or_sizes_raise_type_error(acl, ctx, device_buffer, call):
    ptr = device_buffer(64)
    with pytest.raises(TypeError, match="args parse failed"):
        call(acl, ptr)


def test_numpy_integers_pass_where_pyacl_parses_a_c_int(acl, ctx):
    free, total, ret = acl.rt.get_mem_info(np.int32(C.ACL_HBM_MEM))
    assert ret == 0 and total > 0
    assert acl.rt.set_device(np.int64(0)) == 0
    assert acl.rt.reset_device(0) == 0
    assert acl.rt.set_context(ctx) == 0


def test_elapsed_time_of_an_event_not_yet_completed_is_107006(acl, ctx):
    start, ret = acl.rt.create_event()
    assert ret == 0
    end, ret = acl.rt.create_event()
    assert ret == 0
    stream, ret = acl.rt.create_stream()
    assert ret == 0
    try:
        assert acl.rt.event_elapsed_time(start, end)[1] == C.ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID
        assert acl.rt.record_event(start, stream) == 0
        assert acl.rt.record_event(end, stream) == 0
        assert acl.rt.synchronize_stream(stream) == 0
        ms, ret = acl.rt.event_elapsed_time(start, end)
        assert ret == 0 and ms >= 0.0
    finally:
        for e in (start, end):
            assert acl.rt.destroy_event(e) == 0
        assert acl.rt.destroy_stream(stream) == 0


_LIMITS_SCRIPT = textwrap.dedent("""
    import os
    os.environ["ACLSERVE_CPU_MAX_STREAMS"] = "8"
    os.environ["ACLSERVE_CPU_MAX_EVENTS"] = "5"
    from aclserve.acl import cpu as acl
    assert acl.init() == 0 and acl.rt.set_device(0) == 0
    ctx, ret = acl.rt.create_context(0)
    assert ret == 0
    assert acl.device_limits() == (8, 5)
    events = [acl.rt.create_event_with_flag(1) for _ in range(6)]  # ACL_EVENT_SYNC: limited as made
    print("events", [ret for _, ret in events])
    # in use: the default and the created context's default streams, one internal: 3 of 8
    streams = [acl.rt.create_stream() for _ in range(6)]
    print("streams", [ret for _, ret in streams])
    print("context", acl.rt.create_context(0)[1])
""")


def test_cpu_runtime_enforces_per_device_stream_and_event_limits(cpu_only):
    out = subprocess.run([sys.executable, "-c", _LIMITS_SCRIPT], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())
    assert lines["events"] == str([0] * 5 + [C.ACL_ERROR_RT_NO_EVENT_RESOURCE])
    assert lines["streams"] == str([0] * 5 + [C.ACL_ERROR_RT_NO_STREAM_RESOURCE])
    assert lines["context"] == str(C.ACL_ERROR_RT_NO_STREAM_RESOURCE)


@pytest.mark.parametrize("name, most", [("ACLSERVE_CPU_MAX_STREAMS", 2048), ("ACLSERVE_CPU_MAX_EVENTS", 65535)])
def test_cpu_runtime_limits_are_at_most_what_a_device_allows(monkeypatch, name, most):
    """Up to a C int was taken, a device no SoC is (device_limits is bounded the same way); the
    server's start reads them (check_environment) and says a bad one in one line."""
    from aclserve.acl.cpu import settings
    monkeypatch.setenv(name, str(most))
    settings.check_environment()
    monkeypatch.setenv(name, str(most + 1))
    with pytest.raises(ValueError) as info:
        settings.check_environment()
    assert str(info.value) == f"{name} must be an integer from 1 to {most}, got '{most + 1}'"
