"""The process's ACL runtime: acl.init/finalize and the Device objects, with one owner.

ACL is initialised once per process (CANN refuses a second init and, on older releases, an
init after finalize), so AclRuntime counts its users: the first start() initialises, the last
close() resets the devices and finalises. A device still running the work of one of its own
instances abandoned at close, or being closed, rebuilt or loaded in another thread (teardown.py),
is not reset (another runtime's work there is on its own set_device), and ACL is then not
finalised: both would wait for that work or free memory under it; the process's exit gives the
device back.
"""
from __future__ import annotations

import logging
import os
import threading

from ..acl import AclError, check, compat, release, select
from ..acl import constants as C
from ..acl.soc_limits import documented_limits, limits_for_soc
from . import teardown
from .device import Device

log = logging.getLogger(__name__)

_process_lock = threading.Lock()
_users = 0
RETRY_WAIT_S = 2.0  # how long a close waits for a retry of abandoned instances already running
# The most ONNX Runtime threads a model, the server's cpu_threads and the Engine's: as the CPU runtime
# bounds ACLSERVE_CPU_THREADS (acl/cpu/settings.MAX_THREADS, kept apart: importing that module loads the
# whole CPU runtime, about 0.2 s, which config and an NPU host's server have no use for)
MAX_CPU_THREADS = 1024


def _forget_in_child() -> None:
    """A forked child's ACL has no users: a device's driver state does not survive fork (nor does
    the CPU runtime's: acl/cpu/_state.py), so the child's first start() initialises afresh."""
    global _users, _process_lock
    _users, _process_lock = 0, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


class AclRuntime:
    """Owns: one share of the process's acl.init, and the Devices it opened."""

    def __init__(self, device: str = "auto", cpu_threads: int | None = 1, memory_reserve_fraction: float = 0.1,
                 device_limits: tuple[int | None, int | None] = (None, None),
                 limits_setting: str | None = "device_limits"):
        """cpu_threads: ONNX Runtime threads per model on the CPU runtime; None: its own default
        (ACLSERVE_CPU_THREADS, else 1). limits_setting: the owner's setting that raises the device's
        streams and events (the server's device_limits), named when a load does not fit them; None
        (the Engine, which has none): what does raise them is named instead."""
        if cpu_threads is not None and cpu_threads < 1:
            raise ValueError("cpu_threads must be >= 1")
        self.requested = device
        self.device_limits_override = device_limits
        self.limits_setting = limits_setting
        self.cpu_threads = cpu_threads
        self.memory_reserve_fraction = memory_reserve_fraction
        self.kind: str | None = None
        self.acl = None
        self._devices: dict[int, Device] = {}
        self._lock = threading.Lock()
        self._started = False
        self._failed: dict[int, int] = {}  # device -> the code it failed with as a whole (device_health.py)
        self._on_failure = None  # on_device_failure's callback
        self._after_failure = ("no instance is rebuilt on it, no batch is sent to it, and the calls of a model "
                               "with no instance on another device fail (DeviceFailed): close the Engine and "
                               "restart the process")

    def start(self) -> "AclRuntime":
        global _users
        if self._started:
            return self
        self.kind, self.acl = select(self.requested)
        if self.kind == "cpu":
            self.acl.set_threads(self.cpu_threads)
        with _process_lock:
            if _users == 0:
                check("init", self.acl.init(), also_ok=(C.ACL_ERROR_REPEAT_INITIALIZE,))
            _users += 1
        self._started = True
        compat.probe(self.acl)  # timed waits or not, decided for this SoC (it may differ from the last start's)
        log.info("ACL runtime: %s (%s), %d device(s)", self.kind, self.soc_name(), self.device_count())
        self._say_if_events_above_the_device()
        return self

    def _say_if_events_above_the_device(self) -> None:
        """A WARNING when device_limits.events is above the events the device has (the CPU
        runtime's ACLSERVE_CPU_MAX_EVENTS, else the figure CANN documents for this SoC; none for
        a SoC it does not name). Not refused (a device may allow more than documented), but the
        device does not refuse an event past its own either: a record waits for one to be
        released (CANN, aclrtCreateEvent), and the batch then runs into the execution timeout."""
        configured = self.device_limits_override[1]
        if self.kind == "cpu":
            has, source = self.acl.device_limits()[1], "the CPU runtime has (ACLSERVE_CPU_MAX_EVENTS, by default its SoC's)"
        else:
            soc = self.soc_name()  # ("unknown": no documented figures, as for a SoC not named)
            documented = documented_limits(soc)
            has, source = (documented[1] if documented else None), f"CANN documents for the {soc}"
        if configured is None or has is None or configured <= has:
            return
        log.warning("device_limits.events is %d, above the %d events %s: the ledger lets through models whose "
                    "events the device does not hold, and a record_event past its events waits for one to be "
                    "released (the device does not refuse it): a batch or warm-up run then ends at the execution "
                    "timeout, and the instance rebuilt for it waits alike. Set it above %d only for a device "
                    "that has more", configured, has, source, has)

    def soc_name(self) -> str:
        """The SoC this process runs on ("unknown" when CANN is too old to say)."""
        return compat.soc_name(self.acl) or "unknown"

    def device_limits(self) -> tuple[int, int]:
        """(streams, events) per device: configured, else what the CPU runtime enforces or the
        documented figures of this SoC."""
        known = self.acl.device_limits() if self.kind == "cpu" else limits_for_soc(self.soc_name())
        streams, events = self.device_limits_override
        return (known[0] if streams is None else streams, known[1] if events is None else events)

    def _limits_remedy(self) -> str:
        """How a load refused for streams or events is told to raise them: on the CPU runtime its
        own figures (device_limits above them is warned of: a record past its events waits), unless
        device_limits set them lower; a tester's 57th model was told "set device_limits" there."""
        cpu_own = self.kind == "cpu" and self.device_limits() == tuple(self.acl.device_limits())
        if cpu_own:
            return ("on the CPU runtime set ACLSERVE_CPU_MAX_STREAMS / ACLSERVE_CPU_MAX_EVENTS (by default its "
                    "ACLSERVE_CPU_SOC's) if the device it stands for allows more")
        if self.limits_setting:
            return f"set {self.limits_setting} if this device allows more"
        return "serve it with `aclserve serve`, whose device_limits setting raises them, if this device allows more"

    def device_count(self) -> int:
        return check("rt.get_device_count", self.acl.rt.get_device_count())

    def missing_devices(self, device_ids) -> list[int]:
        """Those of `device_ids` this host has not, before start() too (acl.rt.get_device_count
        needs no acl.init, on a device as on the CPU runtime: a start refuses them before it
        listens); the runtime is selected as start() would (the choice sticks for the process)."""
        if self.acl is None:
            self.kind, self.acl = select(self.requested)
        try:
            count = self.device_count()
        except AclError:  # the count itself failed (a driver's fault): the start's device opening says it, as before
            return []
        return [d for d in dict.fromkeys(device_ids) if not 0 <= d < count]

    def devices_said(self, count: int | None = None) -> str:
        """The devices this host has (`count`, when the caller has asked it), as an error names them:
        `1 device: 0`, `2 devices: 0, 1`, `8 devices: 0..7`, `no device`."""
        count = self.device_count() if count is None else count
        if count == 0:
            return "no device"
        if count == 1:
            return "1 device: 0"
        return f"{count} devices: " + ("0, 1" if count == 2 else f"0..{count - 1}")

    def device(self, device_id: int) -> Device:
        if not self._started:
            raise RuntimeError("AclRuntime.start() was not called")
        with self._lock:
            dev = self._devices.get(device_id)
            if dev is None:
                count = self.device_count()
                if not 0 <= device_id < count:
                    raise ValueError(f"device {device_id} does not exist (the host has {self.devices_said(count)})")
                dev = self._devices[device_id] = Device(self.acl, device_id, self.memory_reserve_fraction,
                                                        self.device_limits(), self._device_failed,
                                                        self._limits_remedy(), owner=self,
                                                        cpu_memory=self.kind == "cpu")
            return dev

    def opened(self, device_id: int) -> Device | None:
        """The device if it is open, without opening it (one not open holds no instance of this runtime's)."""
        with self._lock:
            return self._devices.get(device_id)

    def open_devices(self, device_ids) -> None:
        """Open each of `device_ids` this host has (the server's model_defaults.devices, at its
        start: where its models go unless they say otherwise, so opened by the first load anyway),
        so that memory() has their rows before any model is placed there. Blocking. An id past the
        host's devices is passed over (`aclserve serve` refused it before it listened:
        missing_devices; an app built otherwise leaves it to the load that names it); a device that
        cannot be opened is said in a WARNING and left until a load needs it."""
        for device_id in dict.fromkeys(device_ids):
            if not self._started:  # (closed meanwhile: a shutdown during the start)
                return
            try:
                self.device(device_id)
            except ValueError:  # past the host's devices: refused by serve's start, else by its load
                pass
            except AclError as e:
                log.warning("device %d could not be opened (%s): its memory is not shown until a model loads "
                            "there", device_id, e)

    def on_device_failure(self, callback, after: str) -> None:
        """`callback(device_id, code)` (from the thread that found it) when a device is found
        failed as a whole (device_health.py); `after` says in its ERROR line what follows."""
        self._on_failure, self._after_failure = callback, after

    def _device_failed(self, device_id: int, code: int) -> None:
        with self._lock:
            self._failed[device_id] = code
        log.error("device %d failed as a whole (%d: %s): every task on it fails until it is reset, which "
                  "takes a restart of the process; %s", device_id, code, C.error_meaning(code), self._after_failure)
        if self._on_failure is not None:
            self._on_failure(device_id, code)

    def failed_devices(self) -> int:
        """How many devices were found failed as a whole (no ACL call), for /metrics."""
        return len(self._failed)

    def memory(self, refresh: bool = False) -> list[dict]:
        """Per opened device (a model's, the DVPP decoder's, or one open_devices opened): used, free
        and total bytes, and the reserve loads keep free. Without `refresh` these are the figures
        cached at the last load or refresh, and no ACL call is made (safe on the event loop)."""
        with self._lock:
            devices = list(self._devices.values())
        out = []
        for dev in devices:
            free, total = dev.mem_info() if refresh else dev.cached_mem_info()
            out.append({"device": dev.id, "free": free, "total": total, "used": total - free,
                        "reserve": int(total * dev.memory_reserve_fraction)})
        return out

    def abandoned_instances(self) -> int:
        """Instances abandoned at close whose device work still runs (teardown.py), for /metrics."""
        return teardown.held()

    def close(self) -> None:
        """Reset the devices this runtime opened; the last user finalises ACL. Safe twice.
        Close every pool first: a device is reset only after its instances are gone (or
        abandoned: such a device is left as it is, see the module docstring)."""
        global _users
        if not self._started:
            return
        self._started = False
        with self._lock:
            devices, self._devices = list(self._devices.values()), {}
        # a retry running meanwhile (the retry thread's) is waited for a moment, not for good: it
        # may wait on a hung device
        teardown.release_recovered(wait_s=RETRY_WAIT_S)
        for dev in devices:
            # only this runtime's own work holds its reset back: another Engine's closing or loading
            # on the same device is on its own set_device, which this reset does not touch
            dev.close(reset=not teardown.unreleased(dev.id, owner=self))
        with _process_lock:
            _users -= 1
            if _users == 0 and teardown.unreleased():
                log.warning("ACL not finalized: %d instance(s) abandoned, being closed, rebuilt or loaded "
                            "still run on the device; the process's exit releases them", teardown.unreleased())
            elif _users == 0:
                release("finalize", self.acl.finalize())

    def __enter__(self) -> "AclRuntime":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
