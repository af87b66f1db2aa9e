"""init/finalize codes, argument parsing, version and SoC name."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from aclserve.acl import constants as C

_LIFECYCLE = textwrap.dedent("""
    import json
    from aclserve.acl import select
    kind, acl = select()
    out = {"kind": kind}
    out["before"] = [acl.rt.set_device(0), acl.rt.create_context(0)[1], acl.rt.malloc(64, 2)[1],
                     acl.mdl.load_from_file("/nonexistent.om")[1]]
    out["init"] = [acl.init(), acl.init()]
    acl.rt.set_device(0)
    out["mem"] = list(acl.rt.get_mem_info(1))
    # the CPU runtime's finalize releases what the application left behind (a stream with work,
    # an event, memory), saying so; CANN's leaves them until the process exits
    stream, _ = acl.rt.create_stream()
    event, _ = acl.rt.create_event()
    acl.rt.record_event(event, stream)
    acl.rt.malloc(4 << 20, 0)
    out["finalize"] = [acl.finalize(), acl.finalize()]
    out["after"] = [acl.rt.set_device(0), acl.rt.malloc(64, 2)[1]]
    out["reinit"] = [acl.init(), acl.rt.set_device(0), acl.rt.malloc(64, 2)[1], acl.finalize()]
    if kind == "cpu":
        acl.init()
        out["reinit_used"] = acl.memory_stats(0)["used"]
    print(json.dumps(out))
""")


def test_init_finalize_codes(acl_kind):
    env = dict(os.environ, ACLSERVE_CPU_DEVICE_MEMORY="64M")
    proc = subprocess.run([sys.executable, "-c", _LIFECYCLE], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["init"] == [0, C.ACL_ERROR_REPEAT_INITIALIZE]
    assert out["finalize"] == [0, C.ACL_ERROR_REPEAT_FINALIZE]
    assert out["mem"][2] == 0
    if acl_kind == "cpu":  # capacity from ACLSERVE_CPU_DEVICE_MEMORY; re-init after finalize works
        # stricter than the device, on purpose: CANN's aclrt* calls go to the runtime unchecked
        # before init and after finalize (aclrtSetDevice -> rtSetDevice); the CPU runtime refuses
        # them, so a call outside init..finalize fails where the tests run
        assert out["before"] == [C.ACL_ERROR_UNINITIALIZE] * 4
        assert out["after"] == [C.ACL_ERROR_UNINITIALIZE] * 2
        assert out["mem"][1] == 64 << 20
        assert out["reinit"] == [0, 0, 0, 0]
        assert out["reinit_used"] == 0


@pytest.mark.parametrize("call", [
    lambda acl: acl.rt.malloc(1.0, 0),
    lambda acl: acl.rt.malloc(None, 0),
    lambda acl: acl.rt.malloc(64),
    lambda acl: acl.rt.malloc(64, 0, 0),
    lambda acl: acl.rt.set_device("0"),
    lambda acl: acl.rt.memcpy(0, 0, 0, 0),
    lambda acl: acl.mdl.load_from_file(123),
    lambda acl: acl.create_data_buffer(None, 4),
    lambda acl: acl.rt.launch_callback(None, 0, 0, 0),
    lambda acl: acl.util.ptr_to_numpy(1, [2], 11),
    # size_t / uint64 parameters ("k", "K") take a real int only: a numpy integer is refused
    lambda acl: acl.mdl.set_dynamic_batch_size(1, 1, np.int64(0), 4),
    lambda acl: acl.mdl.set_dynamic_batch_size(1, 1, 0, np.int64(4)),
    lambda acl: acl.mdl.get_input_size_by_index(1, np.int64(0)),
    lambda acl: acl.mdl.get_dataset_buffer(1, np.uint64(0)),
])
def test_wrong_argument_types_raise_type_error(acl, call):
    with pytest.raises(TypeError, match="args parse failed"):
        call(acl)


def test_bytes_to_ptr_rejects_non_bytes(acl):
    with pytest.raises(ValueError):
        acl.util.bytes_to_ptr("text")
    with pytest.raises(ValueError):
        acl.util.bytes_to_ptr(bytearray(4))


def test_version_and_soc_name(acl, acl_kind):
    *version, ret = acl.get_version()
    assert ret == 0 and len(version) == 3 and all(isinstance(v, int) for v in version)
    name = acl.get_soc_name()
    assert isinstance(name, str) and name
    if acl_kind == "cpu":
        assert name == acl.SOC_NAME == "CPU-ORT"


_SOC_WAITS = textwrap.dedent("""
    import json
    from aclserve.acl import select
    kind, acl = select()
    acl.init()
    acl.rt.set_device(0)
    stream, _ = acl.rt.create_stream()
    event, _ = acl.rt.create_event()
    acl.rt.record_event(event, stream)
    print(json.dumps({"soc": acl.get_soc_name(),
                      "timed": [acl.rt.synchronize_event_with_timeout(event, 100),
                                acl.rt.synchronize_stream_with_timeout(stream, 100)],
                      "forever": [acl.rt.synchronize_event_with_timeout(event, -1),
                                  acl.rt.synchronize_stream_with_timeout(stream, -1)]}))
""")


@pytest.mark.parametrize("soc", ["Ascend310", "Ascend310P3"])
def test_the_ascend310_waits_for_an_event_forever_only(acl_kind, soc):
    """CANN: the Atlas 200/300/500 (Ascend310) takes -1 (forever) only as the timeout of
    aclrtSynchronizeEventWithTimeout (its stream waits can be timed); the 310P times both. The
    CPU runtime presents the SoC of ACLSERVE_CPU_SOC (on a device: checked when it is one)."""
    env = dict(os.environ, ACLSERVE_CPU_SOC=soc)
    proc = subprocess.run([sys.executable, "-c", _SOC_WAITS], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if acl_kind == "cpu":
        assert out["soc"] == soc
    elif out["soc"] != soc:
        pytest.skip(f"this device is a {out['soc']}")
    assert out["forever"] == [0, 0]
    assert out["timed"][1] == 0
    assert (out["timed"][0] != 0) == (soc == "Ascend310")


def test_device_count_and_run_mode(acl, acl_kind):
    count, ret = acl.rt.get_device_count()
    assert ret == 0 and count >= 1
    if acl_kind == "cpu":
        assert count == int(os.environ["ACLSERVE_CPU_DEVICES"])
        board = os.environ.get("ACLSERVE_CPU_RUN_MODE") == "device"  # as an Atlas 200 DK
        assert acl.rt.get_run_mode() == (C.ACL_DEVICE if board else C.ACL_HOST, 0)
