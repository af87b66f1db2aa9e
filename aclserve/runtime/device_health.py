"""Whether a device failed as a whole, found with a probe after a fault.

Most device faults fail their own stream or context (an AI Core exception: a gather's index out
of range), and the instance is rebuilt in a new context (pool.py). Some fail the whole device:
an HBM multi-bit ECC error (507054), a sustained page fault on the A2/A3 (507015), a memory
error (507053). CANN then sets the failure on every context of the device and on the device
itself (hicann/runtime ContextManage::SetGlobalFailureErr): every task submitted on it fails,
in any context, a new one included, until the device's count reaches 0 (every context destroyed,
reset_device down to 0), and an in-process reset after such a fault is not reliable on every
chip. A rebuild then fails for good, and would be tried for good.

So after a batch fails on the device (completer.py) and before each rebuild attempt
(builder.py), the device is probed (`failure`): a 64-byte device-to-device memcpy_async on its
management context's default stream and a synchronize of that stream. It takes no stream of its
own (nothing counted against the device's limits: limits.py) and its 128 bytes are allocated and
freed at each probe (allocation still works on a failed device). Where the copy is refused, or
its synchronize fails, with a code a device failed as a whole reports (C.WHOLE_DEVICE_FAILURES:
another code is the copy's own failure, a transient one, which taken as the device's made a
passing copy fault end the server), the device failed as a whole: that stays known (`DeviceHealth.code`, no
probe again) and the device's owner hears it once (AclRuntime.on_device_failure: its one ERROR
line says what follows; the server drains and exits for its supervisor to restart it, which
resets the device). A probe that cannot tell (the allocation refused, its synchronize timed out
behind a hung device, the probe itself raising) takes the device as healthy. Probes block (a completion or rebuild
thread's: never the event loop's) and run one at a time per device.

Once known (one Device, so one DeviceHealth, per device id in a process: AclRuntime.device), no
pool sends a batch to an instance on the device (`on_failed_device`), one never run there since
included: a model with an instance on a healthy device runs there, and one with none fails its
batches at once (`unrunnable`), without touching the device.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

from ..acl import AclError, check, compat, release, using_context
from ..acl import constants as C
from ..errors import DeviceFailed, ExecutionFailed

log = logging.getLogger(__name__)

PROBE_BYTES = 64  # copied from the first half of a 128-byte allocation to its second (64-byte aligned)
PROBE_TIMEOUT_MS = 2_000  # a probe stuck behind a hung device tells nothing


class DeviceHealth:
    """Owned by a runtime Device: its probe and, once found, the code it failed with as a whole."""

    def __init__(self, acl, device_id: int, on_failure: Callable[[int, int], None] | None = None):
        self._acl = acl
        self.device_id = device_id
        self._on_failure = on_failure  # (device_id, code), once, from the probing thread
        self._lock = threading.Lock()
        self.code = 0  # the code it failed with as a whole, once found; 0 until then

    def probe(self, context: int) -> int:
        """The code the device failed with as a whole, or 0: probed through `context` (its
        management context) until found, then remembered. Blocking."""
        if self.code or not context:
            return self.code
        with self._lock:
            found = 0
            if not self.code:
                try:
                    found = self._copy(context)
                except Exception:  # (a context the probe cannot switch to, say: it tells nothing)
                    log.exception("device %d: the probe failed; taken as not failed as a whole", self.device_id)
                if found and found not in C.WHOLE_DEVICE_FAILURES:
                    # a copy's own failure (a transient one, an injected copy fault): not the device's
                    log.warning("device %d: the probe's copy failed with %d (%s), which no device failed as a "
                                "whole reports; taken as not failed", self.device_id, found, C.error_meaning(found))
                    found = 0
                self.code = found
        if found and self._on_failure is not None:
            try:
                self._on_failure(self.device_id, found)
            except Exception:  # (the server's loop closed meanwhile, say): the probing thread goes on
                log.exception("device %d: telling that it failed as a whole failed", self.device_id)
        return self.code

    def _copy(self, context: int) -> int:
        acl = self._acl
        with using_context(acl, context):
            try:
                ptr = check("rt.malloc", acl.rt.malloc(2 * PROBE_BYTES, C.ACL_MEM_MALLOC_NORMAL_ONLY))
            except AclError as e:
                log.debug("device %d: no probe (%s)", self.device_id, e)
                return 0
            code = acl.rt.memcpy_async(ptr + PROBE_BYTES, PROBE_BYTES, ptr, PROBE_BYTES,
                                       C.ACL_MEMCPY_DEVICE_TO_DEVICE, 0)
            if code == C.ACL_SUCCESS:
                try:
                    compat.synchronize_stream(acl, 0, PROBE_TIMEOUT_MS)
                except AclError as e:
                    if e.ret == C.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT:  # the copy may still run: its memory stays
                        log.debug("device %d: probe timed out", self.device_id)
                        return 0
                    code = e.ret
            release("rt.free", acl.rt.free(ptr))
        return code


def failure(device) -> DeviceFailed | None:
    """DeviceFailed saying why, when `device` (a runtime Device) failed as a whole (probed until
    found: blocking), else None."""
    code = device.health.probe(device.context)
    return DeviceFailed(describe(device.id, code)) if code else None


def known_failure(device) -> DeviceFailed | None:
    """DeviceFailed saying why, when `device` was found failed as a whole already (no probe), else None."""
    code = device.health.code
    return DeviceFailed(describe(device.id, code)) if code else None


def on_failed_device(instance) -> bool:
    """Whether `instance` is on a device found failed as a whole (no probe): the pool sends it no
    batch, a re-run or a first one alike (it would fail there, and touch the failed device)."""
    return bool(instance.device.health.code)


def free_slots(instances) -> list[int]:
    """Each of `instances`' free slots as the pool offers them (its lanes()): none on a device found
    failed as a whole while another is on a healthy device (batches go there); with every one on a
    failed device, their own, so that a batch formed for them is answered at once (DeviceFailed) and
    its batcher fails its queue with it, rather than keep its requests waiting for a slot."""
    everywhere = all(on_failed_device(i) for i in instances)
    return [i.free_count() if everywhere or not on_failed_device(i) else 0 for i in instances]


def failed_everywhere(instances) -> DeviceFailed | None:
    """DeviceFailed when the device of every one of `instances` was found failed as a whole (no
    probe): no batch can run on them again in this process. Else None."""
    return known_failure(instances[0].device) if all(i.device.health.code for i in instances) else None


def futile(batch, instances) -> bool:
    """Whether failed `batch` would fail again wherever the pool re-ran it: it failed with DeviceFailed
    and every one of `instances` is on a device that failed as a whole (a re-run would only submit
    more work to a failed device, to fail as ExecutionFailed with a misleading reason). With an
    instance on another, healthy device, it is re-run whole there (not one request per run: no
    request of it is at fault)."""
    return isinstance(batch.error, DeviceFailed) and failed_everywhere(instances) is not None


def unrunnable(instances, model: str, why: str) -> ExecutionFailed:
    """What a batch of `model` that no instance can run fails with, naming the model as the pool's
    other answers do: DeviceFailed once the devices of all `instances` were found failed as a
    whole (no probe), else ExecutionFailed(why)."""
    failed = failed_everywhere(instances)
    return DeviceFailed(f"model {model}: {failed}") if failed is not None else ExecutionFailed(f"model {model}: {why}")


def out_of_service(instances, rebuild_failures: dict[int, str]) -> str | None:
    """Why none of `instances` can run a batch now, or None (requests wait): each is out of rotation
    with its rebuild failed (`rebuild_failures`: lane -> why), or on a device found failed as a whole
    (in rotation still, if it was sent no batch since: none is sent it)."""
    why = []
    for lane, instance in enumerate(instances):
        failed = rebuild_failures.get(lane) if instance.broken else None
        if not failed and (failed := known_failure(instance.device)) is None:
            return None
        why.append(str(failed))
    return f"no instance can run a batch: {why[0]}"


def describe(device_id: int, code: int) -> str:
    return (f"device {device_id} failed as a whole ({code}: {C.error_meaning(code)}): nothing runs on it "
            f"until it is reset, which takes a restart of the process")
