"""The serving path under the device's ownership rules, and the per-device stream/event ledger.

The CPU runtime refuses a model, stream or event used under another context exactly as the
device does, so these run the real instance code against that rule.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from aclserve.acl import current_context
from aclserve.acl.soc_limits import limits_for_soc
from aclserve.runtime import AclRuntime, Batch
from aclserve.runtime.limits import ResourceLimitError
from aclserve.runtime import open_pool
from aclserve.runtime.futures import BatchFutures

from tests.tiny_models import affine_reference

from .own_process import run_script


def _rows(n):
    return {"x": np.arange(n * 8, dtype=np.float32).reshape(n, 8),
            "idx": np.arange(n * 3, dtype=np.int64).reshape(n, 3)}


def test_loading_and_memory_queries_leave_the_callers_context_in_place(runtime, affine_om):
    acl = runtime.acl
    caller, ret = acl.rt.create_context(0)
    assert ret == 0
    try:
        pool = open_pool(runtime, affine_om(), "affine", instances=2, slots=2)
        done = BatchFutures(pool)
        try:
            assert current_context(acl) == caller
            runtime.memory(refresh=True)
            assert current_context(acl) == caller
            out = done.submit([_rows(3)], 4).result(30)
            np.testing.assert_allclose(out.outputs[0]["y"], affine_reference(**_rows(3))["y"], rtol=1e-5)
            for inst in pool.instances:  # the synchronous path switches, then gives the context back
                result = inst.run_sync(Batch([_rows(1)], 1, 1))
                np.testing.assert_allclose(result.outputs[0]["y"], affine_reference(**_rows(1))["y"], rtol=1e-5)
                assert current_context(acl) == caller
        finally:
            pool.close()
        assert current_context(acl) == caller
    finally:
        assert acl.rt.destroy_context(caller) == 0


def test_a_device_that_fails_to_open_leaves_no_context_and_no_count_behind(runtime, clean_faults):
    """A memory query failing while a Device opens left its management context and a set_device
    count behind (the device then never reset), once a try (from a device-memory audit)."""
    from aclserve.acl import AclError
    from aclserve.acl.cpu import _state, faults
    from aclserve.runtime.device import Device
    before = (len(_state.contexts), _state.devices[0].refcount)
    faults.inject("mem_info", count=6, code=507899)  # each try: both attributes' probes and the reading
    for _ in range(2):
        with pytest.raises(AclError, match="507899"):
            Device(runtime.acl, 0)
    assert (len(_state.contexts), _state.devices[0].refcount) == before


def test_room_is_counted_as_the_device_takes_it_huge_pages_included(runtime):
    """aclrtMalloc rounds to 32 and pads 32; a HUGE_FIRST allocation past 1 MiB takes whole 2 MiB
    huge pages (CANN): a load whose plain sum of sizes fits the room left above the reserve but
    whose pages do not is refused before it allocates (it passed, then ate into the reserve or
    failed with 207001; from a device-memory audit)."""
    from aclserve.runtime.device import Device, LoadError, device_bytes
    mib = 1 << 20
    assert [device_bytes(n) for n in (1, 32, 1000, mib - 64, mib, 4 * mib)] == \
        [64, 64, 1056, mib - 32, 2 * mib, 6 * mib]
    device = Device(runtime.acl, 0, memory_reserve_fraction=0.5)
    try:
        free, total = device.mem_info()
        room = free - int(total * 0.5)
        sizes = [mib + 1] * (room // (2 * mib) + 1)  # half the room in plain bytes, past it in pages
        assert sum(sizes) < room
        with pytest.raises(LoadError, match="held in reserve"):
            with device.room("model m", sizes):
                pass
        with device.room("model m", sizes[:-2]):  # within it
            pass
    finally:
        device.close()


def test_room_promised_to_a_load_under_way_is_not_offered_to_another(runtime):
    """Loads run in parallel (load_threads): between a load's check and its allocations the free
    figure still shows the memory it is about to take, so a second load's check counts the
    room promised to the first (a refusal then is tried again later: only the promise stood in
    its way), the first gives back what it allocated (`took`: the free figure shows it from
    then on, and it was counted twice) and, at its end, what it did not."""
    from aclserve.acl import check, using_context
    from aclserve.acl import constants as C
    from aclserve.repository.retry import is_transient
    from aclserve.runtime.device import Device, LoadError, RoomPromised
    acl = runtime.acl
    device = Device(acl, 0, memory_reserve_fraction=0.5)
    try:
        free, total = device.mem_info()
        half_room = (free - int(total * 0.5)) // 2 - 4096
        with device.room("model a", [half_room]) as took:
            with using_context(acl, device.context):
                block = check("rt.malloc", acl.rt.malloc(half_room, C.ACL_MEM_MALLOC_HUGE_FIRST))
            try:
                took(half_room)
                with device.room("model b", [half_room]):  # the other half: fits
                    with pytest.raises(RoomPromised, match="promised to loads under way") as refused:
                        with device.room("model c", [half_room]):
                            pass
                    assert is_transient(refused.value)
            finally:
                with using_context(acl, device.context):
                    check("rt.free", acl.rt.free(block))
        with pytest.raises(LoadError) as over:
            with device.room("model d", [4 * half_room]):  # more than the room: not for later
                pass
        assert not isinstance(over.value, RoomPromised) and not is_transient(over.value)
        with pytest.raises(RuntimeError):
            with device.room("model a", [2 * half_room]):
                raise RuntimeError("its allocation failed")
        with device.room("model e", [2 * half_room]):  # all of it again: nothing left promised
            pass
    finally:
        device.close()


def test_an_instance_built_in_a_thread_without_a_context_serves(runtime, affine_om):
    """Loader threads start with no context; building an instance there must still work."""
    box = {}

    def load():
        box["pool"] = open_pool(runtime, affine_om(), "affine")

    t = threading.Thread(target=load)
    t.start()
    t.join()
    pool = box["pool"]
    done = BatchFutures(pool)
    try:
        assert done.submit([_rows(2)], 2).result(30).rows == 2
    finally:
        pool.close()


def test_a_configuration_beyond_the_device_event_limit_is_refused_before_loading(affine_om):
    # 3 instances x (4 slots x 6 events + 6 for the trace clock) = 90 > 64
    rt = AclRuntime(device="cpu", device_limits=(None, 64)).start()
    try:
        rt.device(0)
        before = rt.memory(refresh=True)
        with pytest.raises(ResourceLimitError, match=r"needs 12 streams and 90 events on device 0, "
                                                    r"which allows \d+ streams and 64 events"):
            open_pool(rt, affine_om(), "affine", instances=3, slots=4)
        assert rt.memory(refresh=True) == before  # nothing was loaded
        pool = open_pool(rt, affine_om(), "affine", instances=2, slots=4)  # 60 events fit
        with pytest.raises(ResourceLimitError, match=r"\(11 and 60 already in use\)"):
            open_pool(rt, affine_om(), "affine2", instances=1, slots=1)
        pool.close()
        open_pool(rt, affine_om(), "affine2", instances=1, slots=1).close()  # released on close
    finally:
        rt.close()


def test_a_pool_claims_the_slots_an_npu_would_build(affine_om):
    """slots: auto builds one slot on the CPU runtime but claims an NPU's two on the ledger,
    so a configuration an NPU could not hold is refused here as well."""
    rt = AclRuntime(device="cpu", device_limits=(None, 16)).start()  # one instance: 12 events for 1 slot, 18 for 2
    try:
        rt.device(0)
        with pytest.raises(ResourceLimitError, match=r"needs 4 streams and 18 events on device 0"):
            open_pool(rt, affine_om(), "affine", slots=1, claimed_slots=2)
        pool = open_pool(rt, affine_om(), "affine", slots=1)
        assert [len(i.slots) for i in pool.instances] == [1]
        pool.close()
    finally:
        rt.close()


def test_documented_limits_by_soc():
    from aclserve.acl.soc_limits import context_streams
    assert limits_for_soc("Ascend310P3") == (1024, 1023)
    assert [limits_for_soc(soc) for soc in ("Ascend910B1", "Ascend910B2", "Ascend910B3", "Ascend910B4")] == \
        [(1984, 65535)] * 4  # the Atlas A2
    # the training series, whose Ascend910B was taken for an A2 by its name's beginning
    assert [limits_for_soc(soc) for soc in ("Ascend910", "Ascend910A", "Ascend910B", "Ascend910ProB")] == \
        [(2048, 65535)] * 4
    assert limits_for_soc("Ascend310B1") == (512, 65535)
    assert limits_for_soc(None) == (1024, 1023)
    # CANN's aclrtCreateContext: a default and an internal-sync stream on the Atlas inference products
    assert [context_streams(soc) for soc in ("Ascend310", "Ascend310P3", "Ascend310B1", None, "unknown")] == [2] * 5
    assert [context_streams(soc) for soc in ("Ascend910", "Ascend910B2", "Ascend910_9391", "CPU-ORT")] == [1] * 4


_FILL_THE_DEVICE = """
import json, sys
from aclserve.acl import restoring_context
from aclserve.acl.cpu import _state
from aclserve.runtime import AclRuntime, open_pool
from aclserve.runtime.limits import ResourceLimitError
path, fits = sys.argv[1], int(sys.argv[2])
rt = AclRuntime(device="cpu").start()
ledger, out = rt.device(0).ledger, {}
out["opened"] = [ledger.streams, _state.streams_in_use(0)]
try:
    open_pool(rt, path, "affine", instances=fits + 1, slots=1)
except ResourceLimitError as e:
    out["refused"] = str(e)
pool = open_pool(rt, path, "affine", instances=fits, slots=1)
out["loaded"] = [ledger.streams, _state.streams_in_use(0)]
with restoring_context(rt.acl):
    out["one_more_context"] = rt.acl.rt.create_context(0)[1]
pool.close()
rt.close()
print(json.dumps(out))
"""


@pytest.mark.parametrize("soc, context_streams", [("Ascend310P3", 2), ("Ascend310B1", 2), ("Ascend910B2", 1)])
def test_the_ledger_counts_a_context_s_streams_as_the_soc_makes_them(affine_om, soc, context_streams):
    """On the Atlas inference products a created context holds 2 streams, a default one and one for
    internal synchronisation (CANN's aclrtCreateContext); the 910-class hold 1. Both the CPU runtime
    and the ledger counted 1 whatever the SoC, so on a 310P the ledger let 255 instances through
    where the device holds 204, and the load failed at create_stream (207008, retried as transient).
    With streams for 4 instances by CANN's arithmetic (set_device's 2, the management context's, 3
    and a context an instance), a 5th is the ledger's refusal, and the 4 fill the device exactly."""
    per_instance, base = 3 + context_streams, 2 + context_streams
    streams, events = base + 4 * per_instance, limits_for_soc(soc)[1]  # the SoC's events: not set here
    out, _ = run_script(_FILL_THE_DEVICE, affine_om(), "4", devices=1, ACLSERVE_CPU_SOC=soc,
                        ACLSERVE_CPU_MAX_STREAMS=str(streams))
    assert out["opened"] == [base, base]
    assert out["refused"] == (f"model affine (5 instance(s) x 1 slots) needs {5 * per_instance} streams and 60 "
                              f"events on device 0, which allows {streams} streams and {events} events ({base} and 0 "
                              f"already in use); give models fewer instances or slots, spread them over more "
                              f"devices, or on the CPU runtime set ACLSERVE_CPU_MAX_STREAMS / ACLSERVE_CPU_MAX_EVENTS "
                              f"(by default its ACLSERVE_CPU_SOC's) if the device it stands for allows more")
    assert out["loaded"] == [streams, streams]
    assert out["one_more_context"] == 207008  # ACL_ERROR_RT_NO_STREAM_RESOURCE: the device is full


_FILL_WITH_STREAMS_AND_EVENTS = """
import json, os
for name in ("ACLSERVE_CPU_MAX_STREAMS", "ACLSERVE_CPU_MAX_EVENTS"):
    os.environ.pop(name, None)  # only the SoC set: the limits are its defaults
from aclserve.acl import constants as C
from aclserve.acl import cpu as acl
assert acl.init() == 0 and acl.rt.set_device(0) == 0
out = {"soc": acl.get_soc_name(), "device_limits": acl.device_limits()}
streams = []
while len(streams) <= 4096:
    stream, ret = acl.rt.create_stream()
    if ret != 0:
        out["streams"] = [len(streams), ret]
        break
    streams.append(stream)
events = []
while len(events) <= 70000:
    event, ret = acl.rt.create_event_with_flag(C.ACL_EVENT_SYNC)  # limited as made
    if ret != 0:
        out["events"] = [len(events), ret]
        break
    events.append(event)
for event in events:
    assert acl.rt.destroy_event(event) == 0
for stream in streams:
    assert acl.rt.destroy_stream(stream) == 0
assert acl.rt.reset_device(0) == 0 and acl.finalize() == 0
print(json.dumps(out))
"""


@pytest.mark.parametrize("soc, streams, events", [("Ascend310B1", 512, 65535), ("Ascend910B2", 1984, 65535),
                                                   ("Ascend910B", 2048, 65535)])
def test_the_cpu_runtime_presents_the_limits_of_the_soc_it_presents(soc, streams, events):
    """With only ACLSERVE_CPU_SOC set, a device has the streams and events CANN documents for that
    SoC (310B: 512 / 65535, the A2's 910B2: 1984 / 65535, the training series' 910B: 2048 / 65535,
    where it had the A2's): it had the 310P's 1024 / 1023 whatever the SoC, so a test emulating a
    SoC met limits its device does not have unless it set them itself.
    set_device's default context and the device's internal stream leave 2 fewer streams to create."""
    out, _ = run_script(_FILL_WITH_STREAMS_AND_EVENTS, devices=1, ACLSERVE_CPU_SOC=soc)
    assert out["soc"] == soc
    assert out["device_limits"] == [streams, events]
    assert out["streams"] == [streams - 2, 207008]  # ACL_ERROR_RT_NO_STREAM_RESOURCE
    assert out["events"] == [events, 207007]  # ACL_ERROR_RT_NO_EVENT_RESOURCE


_DVPP_BESIDE_A_MODEL = """
import json, sys
from aclserve.acl.cpu import _state
from aclserve.images.decode import CpuDecoder
from aclserve.images.dvpp import DvppDecoder, DvppError
from aclserve.runtime import AclRuntime, open_pool
path = sys.argv[1]
rt = AclRuntime(device="cpu").start()
ledger, out = rt.device(0).ledger, {}
decoder = DvppDecoder(rt, CpuDecoder(1 << 20, 4096))
out["decoder"] = [ledger.streams, _state.streams_in_use(0)]
try:
    open_pool(rt, path, "affine", instances=2, slots=1)
except Exception as e:
    out["refused"] = f"{type(e).__name__}: {e}"
pool = open_pool(rt, path, "affine", instances=1, slots=1)
out["loaded"] = [ledger.streams, _state.streams_in_use(0)]
decoder.close()
out["closed"] = [ledger.streams, _state.streams_in_use(0)]
other = open_pool(rt, path, "affine2", instances=1, slots=1)
out["other"] = [ledger.streams, _state.streams_in_use(0)]
try:
    DvppDecoder(rt, CpuDecoder(1 << 20, 4096))
except DvppError as e:
    out["full"] = [str(e), ledger.streams]
other.close()
pool.close()
rt.close()
print(json.dumps(out))
"""


def test_the_dvpp_decoder_s_context_and_stream_count_on_the_ledger(affine_om):
    """The DVPP decoder's context and stream were not on the ledger: with it open, a load the
    ledger let through failed at create_stream (207008, retried as transient). 11 streams: set_device's
    2, the management context's 1, the decoder's 2 and one instance's 4 leave no room for a second;
    closed, the decoder gives its 2 back. A decoder opened on a full device is refused by the ledger
    (the server decodes with Pillow then), which its claim leaves as it was."""
    out, _ = run_script(_DVPP_BESIDE_A_MODEL, affine_om(), devices=1, ACLSERVE_CPU_MAX_STREAMS="11")
    assert out["decoder"] == [5, 5]
    assert out["refused"] == ("ResourceLimitError: model affine (2 instance(s) x 1 slots) needs 8 streams and 24 "
                              "events on device 0, which allows 11 streams and 1023 events (5 and 0 already in use); "
                              "give models fewer instances or slots, spread them over more devices, or on the CPU "
                              "runtime set ACLSERVE_CPU_MAX_STREAMS / ACLSERVE_CPU_MAX_EVENTS (by default its "
                              "ACLSERVE_CPU_SOC's) if the device it stands for allows more")
    assert out["loaded"] == [9, 9]
    assert out["closed"] == [7, 7]
    assert out["other"] == [11, 11]
    message, streams = out["full"]
    assert message.startswith("ResourceLimitError: the DVPP decoder (a context and its stream) needs 2 streams and "
                              "0 events on device 0, which allows 11 streams"), message
    assert streams == 11


def test_the_slots_bound_is_what_the_largest_device_holds_for_one_instance():
    """MAX_SLOTS (slots past it are refused at the start, not at the load) from these limits."""
    from aclserve.acl.soc_limits import SOC_LIMITS
    from aclserve.runtime.limits import EVENTS_PER_INSTANCE, EVENTS_PER_SLOT, MAX_SLOTS
    most = max(events for _, events in SOC_LIMITS.values())
    assert MAX_SLOTS * EVENTS_PER_SLOT + EVENTS_PER_INSTANCE <= most < (MAX_SLOTS + 1) * EVENTS_PER_SLOT + \
        EVENTS_PER_INSTANCE


def test_an_om_whose_size_query_is_refused_loads_with_load_from_file(runtime, affine_om, caplog):
    """CANN's query_size refuses fully dynamic-shape OMs; aclserve then lets CANN allocate."""
    from aclserve.acl.cpu import faults

    path = affine_om()
    faults.inject("query_size", nth=1, code=500002)
    try:
        pool = open_pool(runtime, path, "affine")
        done = BatchFutures(pool)
    finally:
        faults.clear()
    try:
        assert "loading with load_from_file" in caplog.text
        model = pool.instances[0].model
        assert (model.work_size, model.weight_size) == (0, 0)
        out = done.submit([_rows(2)], 2).result(30)
        np.testing.assert_allclose(out.outputs[0]["y"], affine_reference(**_rows(2))["y"], rtol=1e-5)
    finally:
        pool.close()


def test_a_timing_error_is_logged_once_and_never_fails_the_batch(runtime, affine_om, caplog):
    """event_elapsed_time on events without a timestamp answers 107006; the timings are then
    zero and the batch result stands."""
    from aclserve.acl import using_context

    pool = open_pool(runtime, affine_om(), "affine")
    done = BatchFutures(pool)
    try:
        inst = pool.instances[0]
        acl = runtime.acl
        with using_context(acl, inst.context):
            fresh = {name: acl.rt.create_event()[0] for name in inst.slots[0].EVENTS}
            try:
                for _ in range(2):
                    timings = inst._completer.timings(fresh)
                    assert (timings.h2d_ms, timings.compute_ms, timings.d2h_ms) == (0.0, 0.0, 0.0)
            finally:
                for event in fresh.values():
                    assert acl.rt.destroy_event(event) == 0
        assert caplog.text.count("device timings unavailable") == 1 and "107006" in caplog.text
        assert done.submit([_rows(2)], 2).result(30).timings.compute_ms > 0  # real timings still flow
    finally:
        pool.close()
