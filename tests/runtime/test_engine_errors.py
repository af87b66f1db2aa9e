"""What the Python API raises (found by a new-user tester): classes `aclserve` exports, one for a
closed model or engine either way, each with a message; a corrupt OM's LoadError says why, and
nothing is printed to a caller who set up no logging."""
from __future__ import annotations

import subprocess
import sys
import threading

import pytest

import aclserve
from aclserve.acl.cpu import faults
from aclserve.runtime import Engine

from tests import REPO
from tests.tiny_models import affine_request

from .own_process import run_script

pytestmark = pytest.mark.usefixtures("clean_faults")


def test_a_closed_model_or_engine_raises_closed_either_way(affine_om):
    """A call after model.close() raised ExecutionFailed 'model m is closed', after engine.close()
    a RuntimeError; Closed is both."""
    engine = Engine(device="cpu")
    model, other = engine.load(affine_om()), engine.load(affine_om(), name="other")
    other.close()
    with pytest.raises(aclserve.Closed, match="^model other is closed$"):
        other.infer(affine_request(1))
    engine.close()
    with pytest.raises(aclserve.Closed, match="^the engine is closed: make a new Engine$"):
        model.infer(affine_request(1))
    with pytest.raises(aclserve.Closed, match="^the engine is closed"):
        engine.load(affine_om())
    assert issubclass(aclserve.Closed, RuntimeError) and issubclass(aclserve.Closed, aclserve.ExecutionFailed)


def test_an_infer_timeout_says_what_passed(affine_om):
    """infer(..., timeout=0) raised a TimeoutError with no message."""
    with Engine(device="cpu") as engine:
        model = engine.load(affine_om())
        gate = threading.Event()
        faults.inject("execute", nth=1, hold=gate, code=0)
        try:
            with pytest.raises(TimeoutError, match=r"^model affine: the call was not answered within 0 s; it is given "
                                                   r"up: its runs not launched yet are dropped$"):
                model.infer(affine_request(1), timeout=0)
        finally:
            gate.set()


def test_load_refusals_are_load_errors(affine_om):
    """A configuration the device cannot hold raised limits.ResourceLimitError, not a LoadError."""
    with Engine(device="cpu") as engine:
        with pytest.raises(aclserve.LoadError, match="needs .* events on device 0"):
            engine.load(affine_om(), slots=1024)
        with pytest.raises(aclserve.LoadError, match="does not exist"):
            engine.load(affine_om() + ".gone")


def test_a_load_past_the_device_s_limits_names_what_raises_them_for_an_engine(affine_om):
    """Engine's refusal advised "set device_limits", a server setting Engine does not take (found by
    a tester of the Python API); on the CPU runtime the variables that set its limits are named."""
    with Engine(device="cpu") as engine:
        with pytest.raises(aclserve.LoadError) as refused:
            engine.load(affine_om(), slots=1024)
    assert str(refused.value).endswith("give models fewer instances or slots, spread them over more devices, or on "
                                       "the CPU runtime set ACLSERVE_CPU_MAX_STREAMS / ACLSERVE_CPU_MAX_EVENTS (by "
                                       "default its ACLSERVE_CPU_SOC's) if the device it stands for allows more")
    assert "device_limits" not in str(refused.value)


ENGINE_ON_A_DEVICE = """
import json, sys
import aclserve
try:
    with aclserve.Engine(device=sys.argv[1]) as engine:
        print(json.dumps(engine.runtime.kind))
except Exception as e:
    print(json.dumps(type(e).__name__ + ": " + str(e)))
"""


@pytest.mark.parametrize("device, variable, outcome", [
    ("auto", "bogus", "ValueError: ACLSERVE_DEVICE must be one of auto, npu, cpu, not 'bogus'"),
    ("auto", "cpu", "cpu"),
    ("cpu", "npu", "cpu"),  # an explicit device wins over the variable, as the server's config does
])
def test_engine_auto_follows_aclserve_device_and_an_explicit_device_wins(device, variable, outcome):
    """What the README says of Engine(device=...) and ACLSERVE_DEVICE (a tester found the variable
    undocumented for Engine): auto defers to it, npu or cpu given wins over it."""
    out, _ = run_script(ENGINE_ON_A_DEVICE, device, ACLSERVE_DEVICE=variable)
    assert out == outcome


LOAD_A_CORRUPT_OM = """
import sys
import aclserve
with aclserve.Engine(device="cpu") as engine:
    try:
        engine.load(sys.argv[1])
    except aclserve.LoadError as e:
        print(e)
"""


def test_a_corrupt_om_s_load_error_says_what_is_wrong_and_nothing_is_printed(affine_om):
    """The LoadError sent the caller to 'the server log', which an Engine has none of; the reason
    reached stderr by logging's last resort (found by a new-user tester flipping a byte of
    models/digits.om)."""
    path = affine_om()
    with open(path, "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 0xFF]))  # a payload byte
    proc = subprocess.run([sys.executable, "-c", LOAD_A_CORRUPT_OM, path], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "is a CPU OM, built for aclserve's CPU runtime, and was refused: CPU OM payload checksum mismatch " \
           "(corrupt file); compile its ONNX model again" in proc.stdout, proc.stdout
    assert proc.stderr == ""


_DEVICE_FAILURE = """
import json, sys, time
import aclserve
from aclserve.acl.cpu import faults
from tests.tiny_models import affine_request
out = {}
with aclserve.Engine(device="cpu") as engine:
    model = engine.load(sys.argv[1], instances=2)
    faults.inject("execute", nth=1, code=507054, device=True)
    errors = []
    for _ in range(3):
        try:
            model.infer(affine_request(1), timeout=60)
        except aclserve.DeviceFailed as e:
            errors.append(str(e))
    pool = model.pool
    for _ in range(600):  # (a hang guard) until both rebuild threads have stopped
        if not any(thread.is_alive() for thread in pool._rebuilding.values()):
            break
        time.sleep(0.05)
    out = {"errors": errors, "rebuilds": pool.rebuilds, "rebuilds_failed": pool.rebuilds_failed,
           "alive": [thread.is_alive() for thread in pool._rebuilding.values()],
           "out_of_service": pool.out_of_service()}
print(json.dumps(out))
"""


def test_a_device_that_failed_as_a_whole_raises_device_failed_and_is_not_rebuilt(affine_om):
    """Its instances were rebuilt for good, each rebuild failing on the device. The one that
    found it is not rebuilt; the other is sent no batch from then on (the calls fail at once), so
    it has nothing to rebuild. In a process of its own: the CPU runtime's device stays failed until
    every user lets go of it."""
    out, stderr = run_script(_DEVICE_FAILURE, affine_om(), timeout=120)
    assert len(out["errors"]) == 3, (out, stderr[-3000:])
    assert all("device 0 failed as a whole (507054: HBM multi-bit ECC error)" in e for e in out["errors"])
    assert out["rebuilds"] == 0 and out["alive"] == [False]  # refused at once, not tried again
    assert out["rebuilds_failed"] == 1
    assert out["out_of_service"].startswith("no instance can run a batch: device 0 failed as a whole")
    failed = [line for line in stderr.splitlines() if line.startswith("device 0 failed as a whole")]
    assert len(failed) == 1 and "close the Engine and restart the process" in failed[0], stderr[-3000:]


_PASSING_COPY_FAULTS = """
import json, sys
import aclserve
from aclserve.acl.cpu import faults
from aclserve.acl import AclError
from aclserve.runtime import device_health
from tests.tiny_models import affine_request
out = {"errors": []}
with aclserve.Engine(device="cpu") as engine:
    model = engine.load(sys.argv[1])
    faults.inject("memcpy", count=2, code=507899)  # the batch's copy fails, and the probe's copy after it
    try:
        model.infer(affine_request(1), timeout=60)
    except aclserve.ExecutionFailed as e:
        out["errors"].append(type(e).__name__)
    faults.clear()

    def raising(self, context):
        raise AclError("rt.set_context", 507899)
    device_health.DeviceHealth._copy = raising  # a probe that cannot even start
    faults.inject("execute", nth=1, code=507011)
    try:
        model.infer(affine_request(1), timeout=60)
    except aclserve.ExecutionFailed as e:
        out["errors"].append(type(e).__name__)
    out["after"] = model.infer(affine_request(1), timeout=120)["y"].tolist()  # rebuilt, serving again
    out["failed_devices"] = engine.runtime.failed_devices()
print(json.dumps(out))
"""


_AFTER_DEVICE_FAILURE = """
import json, sys
import aclserve
from aclserve.acl.cpu import faults
from aclserve.repository import retry
from tests.tiny_models import affine_request
out = {}
with aclserve.Engine(device="cpu") as engine:
    model = engine.load(sys.argv[1], instances=2)
    faults.inject("execute", nth=1, code=507054, device=True)
    try:
        model.infer(affine_request(1), timeout=60)
    except aclserve.DeviceFailed as e:
        out["error"], out["transient"] = str(e), retry.is_transient(e)
    out["reruns"] = model.pool.batch_faults.reruns
    try:
        engine.load(sys.argv[1], name="again", warmup=False)
        out["load"] = "loaded"
    except aclserve.DeviceFailed as e:
        out["load"] = str(e)
    from aclserve.runtime.builder import check_room
    try:  # (a server's load of an .onnx asks it before the compile: loader.room_for)
        check_room(engine.runtime, "again")
        out["check"] = "fits"
    except aclserve.DeviceFailed as e:
        out["check"] = str(e)
print(json.dumps(out))
"""


def test_a_copy_that_fails_on_its_own_or_a_probe_that_raises_is_no_device_failed_as_a_whole(affine_om):
    """The probe's own copy failing with a code no device failed as a whole reports (a passing
    copy fault) was taken as the device's: DeviceFailed for good, and the server exited 75 (a
    reviewer: memcpy:nth=40,count=2,code=507899). A probe that raised killed the completion
    thread, its batch never answered. Both now tell nothing: the instance is rebuilt as after
    any fault and serves on."""
    out, stderr = run_script(_PASSING_COPY_FAULTS, affine_om(), timeout=240)
    assert out["errors"] == ["ExecutionFailed", "ExecutionFailed"], (out, stderr[-3000:])
    assert out["failed_devices"] == 0 and len(out["after"]) == 1


def test_after_a_device_failed_as_a_whole_nothing_more_is_tried_on_it(affine_om):
    """(found by a tester) Its failed batch was re-run on the model's other instance, on the same
    failed device (failing again, as ExecutionFailed); a load there succeeded without a warm-up,
    to fail at its first call, and the server's load retry took DeviceFailed for transient."""
    out, stderr = run_script(_AFTER_DEVICE_FAILURE, affine_om(), timeout=120)
    assert "device 0 failed as a whole (507054: HBM multi-bit ECC error)" in out["error"], out
    assert out["reruns"] == 0, (out, stderr[-3000:])
    assert out["transient"] is False
    assert out["load"].startswith("device 0 failed as a whole (507054: HBM multi-bit ECC error)"), out
    assert out["check"] == out["load"], out  # refused before an .onnx's compile too, in the same words
    assert "leaves rotation and is rebuilt" not in stderr and "rebuilding instance" not in stderr


_ANOTHER_DEVICE_SERVES = """
import json, sys
import aclserve
from aclserve.acl.cpu import faults
from aclserve.runtime.builder import open_pool
from aclserve.runtime.engine import EngineModel
from tests.tiny_models import affine_request


def outcome(model):
    try:
        model.infer(affine_request(1), timeout=60)
        return "answered"
    except aclserve.ExecutionFailed as e:
        return f"{type(e).__name__}: {e}"


out = {}
with aclserve.Engine(device="cpu") as engine:
    path = sys.argv[1]
    # two instances on device 1, one on device 0 (each on the device of its list holding the fewest: lanes 0 and 2
    # on device 1, lane 1 on device 0; once's lane 0 on device 0, which holds fewer, lane 1 on device 1)
    mixed = EngineModel(open_pool(engine.runtime, path, "mixed", instances=3, devices=(1, 1, 0)), engine)
    once = engine.load(path, name="once", instances=2, devices=(1, 0), retry=False, warmup=False)
    alone = engine.load(path, name="alone", devices=(1,), warmup=False)  # never run before device 1 fails
    faults.inject("execute", nth=1, code=507054, device=True)
    out["mixed"] = [outcome(mixed) for _ in range(3)]  # the first fails on mixed#0, device 1, and is re-run
    out["once"], out["alone"] = outcome(once), outcome(alone)
    out["lanes"] = {m.name: m.pool.lanes() for m in (mixed, once, alone)}
    out["faults"] = {m.name: m.pool.fault_counts() for m in (mixed, once, alone)}
    out["out_of_service"] = {m.name: m.pool.out_of_service() for m in (mixed, once, alone)}
    mixed.close()
print(json.dumps(out))
"""


def test_once_a_device_failed_as_a_whole_no_batch_goes_to_it(affine_om):
    """A re-run of a batch that failed on a device failed as a whole went to the model's other
    instance on that device (not broken: it had not run since), failing again while an instance
    on a healthy device was idle; a new batch of a model with an instance there went to it too; and
    a model all on a device another model had found failed sent its first batch there. Now none
    goes to it: the healthy device's instance runs them, and a model with none fails at once with
    DeviceFailed, its device untouched (no fault counted)."""
    out, stderr = run_script(_ANOTHER_DEVICE_SERVES, affine_om(), devices=2, timeout=120)
    whole = "device 1 failed as a whole (507054: HBM multi-bit ECC error)"
    assert out["mixed"] == ["answered"] * 3 and out["once"] == "answered", (out, stderr[-3000:])
    assert out["alone"].startswith(f"DeviceFailed: model alone: {whole}"), out
    assert out["faults"] == {"mixed": {"507054": 1}, "once": {}, "alone": {}}, out  # only the batch that found it
    # offered to the batcher: no lane on the failed device while another serves; with none, its own
    assert out["lanes"] == {"mixed": [0, 2, 0], "once": [2, 0], "alone": [2]}, out
    # not ready (/v2/models/alone/ready): its instance, never broken, is on a failed device
    assert out["out_of_service"] == {"mixed": None, "once": None,
                                     "alone": f"no instance can run a batch: {whole}: nothing runs on it until it "
                                              f"is reset, which takes a restart of the process"}, out


_WAITING_FOR_A_SLOT = """
import json, logging, sys, threading
import aclserve
from aclserve.acl.cpu import faults
from tests.tiny_models import affine_request

said = []
handler = logging.Handler()
handler.emit = lambda record: said.append(record.getMessage())
logging.getLogger("aclserve.runtime.instance").addHandler(handler)
logging.getLogger("aclserve.runtime.instance").setLevel(logging.INFO)
with aclserve.Engine(device="cpu") as engine:
    model = engine.load(sys.argv[1], devices=(1,), slots=1, warmup=False)
    gate = threading.Event()
    held = faults.inject("execute", nth=1, code=507054, device=True, hold=gate)
    calls = [model.submit(affine_request(1)) for _ in range(3)]  # the first runs, held; two wait for its slot
    held.entered.wait(30)
    gate.set()
    errors = []
    for call in calls:
        try:
            call.result(timeout=60)
            errors.append("answered")
        except aclserve.ExecutionFailed as e:
            errors.append(f"{type(e).__name__}: {e}")
    out = {"errors": errors, "faults": model.pool.fault_counts(), "broken": [i.broken for i in model.pool.instances],
           "lanes": model.pool.lanes(), "streams": [line for line in said if "streams" in line]}
print(json.dumps(out))
"""


def test_batches_waiting_for_a_slot_on_a_device_failed_as_a_whole_fail_at_once(affine_om):
    """Where streams do not stop on a failure (an Ascend310), the instance is not taken out of
    rotation, so nothing is rebuilt: the batches waiting in the pool for its slot were launched
    on the failed device when it came back. Now they fail at once with DeviceFailed, untouched
    (without an answer they waited for good). The slot comes back without a stream reset, said
    so (it was reset, and said "serving again", of an instance nothing is sent to again)."""
    out, stderr = run_script(_WAITING_FOR_A_SLOT, affine_om(), devices=2, ACLSERVE_CPU_SOC="Ascend310")
    whole = "device 1 failed as a whole (507054: HBM multi-bit ECC error)"
    assert out["broken"] == [None], out  # (not rebuilt: no rebuild answered them)
    assert out["errors"][0].startswith("DeviceFailed: batch of 1 row (gear 1) failed on device 1"), out
    assert out["errors"][1:] == [f"DeviceFailed: model affine: {whole}: nothing runs on it until it is reset, "
                                 f"which takes a restart of the process"] * 2, out
    assert out["faults"] == {"507054": 1}, out  # the batch that found it only
    # its slot came back without a stream reset (nothing runs on the device again), which it said was
    # done, "serving again"; free all the same, so that a batch formed for it is answered at once
    assert out["streams"] == [f"affine#0: streams not reset after the device fault: {whole}: nothing runs on it "
                              f"until it is reset, which takes a restart of the process; the instance takes no "
                              f"batch again"], out
    assert out["lanes"] == [1], out


_PARTS_ON_A_FAILED_DEVICE = """
import json, sys
from aclserve.acl.cpu import faults
from aclserve.runtime import AclRuntime
from aclserve.runtime.builder import open_pool
from aclserve.runtime.futures import BatchFutures
from tests.tiny_models import affine_request

with AclRuntime(device="cpu") as runtime:
    pool = open_pool(runtime, sys.argv[1], "split", instances=2, devices=(1, 0))  # lane 0 on device 1
    done = BatchFutures(pool)
    faults.inject("execute", nth=1)  # the batch of two fails (507011): each request re-run alone, on lane 0
    faults.inject("execute", nth=2, code=507054, device=True)  # the first request's run fails device 1
    batch = done.submit([affine_request(1, 0), affine_request(1, 10)], gear=2, lane=0).result(timeout=60)
    out = {"errors": [None if e is None else type(e).__name__ for e in batch.errors],
           "ran_on": [run.instance for run in batch.runs], "faults": [i.fault_counts() for i in pool.instances]}
    pool.close()
print(json.dumps(out))
"""


def test_the_requests_of_a_failed_batch_run_alone_leave_a_device_failed_as_a_whole(affine_om):
    """A batch's requests re-run one at a time (isolation.py) stayed on the instance it failed on,
    not taken out of rotation where streams do not stop on a failure (an Ascend310), after its
    device failed as a whole: the next request failed there too. It goes to a healthy device's."""
    out, stderr = run_script(_PARTS_ON_A_FAILED_DEVICE, affine_om(), devices=2, ACLSERVE_CPU_SOC="Ascend310")
    assert out == {"errors": ["DeviceFailed", None], "ran_on": ["split#1"],
                   "faults": [{"507011": 1, "507054": 1}, {}]}, (out, stderr[-3000:])
