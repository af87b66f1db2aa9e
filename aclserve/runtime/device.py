"""One Ascend device (or CPU-runtime device): set_device, a management context, memory figures.

The Device owns its set_device reference, a management context used for memory queries, and
the ledger of streams and events its models (and the DVPP decoder) claim. Instances create their own contexts on it.
Every method that switches to the management context restores the caller's context before it
returns, so an instance building its model and buffers keeps its own context current. The last
memory figures are cached (`cached_mem_info`) for readers on the event loop, which must not call
into ACL. close() resets the device; the owner (AclRuntime) closes devices only after every
instance on them is closed.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import Iterable

from ..acl import AclError, check, release, restoring_context, using_context
from ..acl import constants as C
from ..acl.compat import soc_name
from ..acl.soc_limits import context_streams, limits_for_soc
from ..errors import LoadError
from .device_health import DeviceHealth
from .limits import SERVER_REMEDY, DeviceLedger

log = logging.getLogger(__name__)


class NoRoom(LoadError):
    """The device has not the room a load needs beyond its memory reserve (what the remedy is
    depends on the model's settings: repository/served.py adds a config's). `facts` and `remedy`:
    the two halves of the message, when the room is held by what is loaded (builder.py names the
    model's own instances there); a refusal no unload can help says it in `facts` alone. `device`
    and `needed` (bytes), when an unload there may make room: the load waits for it
    (repository/room_waits.py); kept by `said_as`."""

    device: Device | None = None
    needed: int = 0

    def __init__(self, facts: str, remedy: str = ""):
        super().__init__(f"{facts}; {remedy}" if remedy else facts)
        self.facts, self.remedy = facts, remedy

    def said_as(self, facts: str, remedy: str = "") -> NoRoom:
        """The same refusal, waiting for the same room, said as `facts` and `remedy`."""
        error = NoRoom(facts, remedy)
        error.device, error.needed = self.device, self.needed
        return error


class RoomPromised(LoadError):
    """The room a load needs is free but promised to other loads under way: a later attempt
    may find it (repository/retry.py takes it as transient)."""


HUGE_PAGE = 2 << 20
HUGE_PAGES_ABOVE = 1 << 20  # a HUGE_FIRST allocation past this takes huge pages


def device_bytes(size: int) -> int:
    """What a HUGE_FIRST malloc of `size` bytes takes of the device: aclrtMalloc rounds it to 32
    bytes and pads 32 more, and past 1 MiB the driver gives whole 2 MiB huge pages (CANN's
    aclrtMalloc page: "内存申请粒度为2M，不足2M的倍数，向上2M对齐"), which get_mem_info's free
    figure loses. A 4 MiB tensor takes 6 MiB."""
    padded = -(-size // 32) * 32 + 32
    return -(-padded // HUGE_PAGE) * HUGE_PAGE if padded > HUGE_PAGES_ABOVE else padded


class Device:
    """Owns: the device's set_device count and one management context, through which its
    `health` probes whether it failed as a whole (device_health.py: `on_failure(device_id, code)`
    hears it once). `limits_remedy`: how a load refused for streams or events is told to raise them."""

    def __init__(self, acl, device_id: int, memory_reserve_fraction: float = 0.1,
                 limits: tuple[int, int] | None = None, on_failure=None, limits_remedy: str = SERVER_REMEDY,
                 owner=None, cpu_memory: bool = False):
        """owner: the AclRuntime that opened it (teardown.py counts the work on it per owner);
        cpu_memory: its memory is the CPU runtime's (ACLSERVE_CPU_DEVICE_MEMORY sets it)."""
        if not 0.0 <= memory_reserve_fraction < 1.0:
            raise ValueError("memory_reserve_fraction must be within [0, 1)")
        self._acl = acl
        self.id = device_id
        self.owner = owner
        self.memory_reserve_fraction = memory_reserve_fraction
        self._cpu_memory = cpu_memory
        self._lock = threading.Lock()
        # set_device and create_context both switch this thread; a failure on the way undoes what
        # was done (a failed memory query left the context and a count of the device behind)
        with restoring_context(acl), contextlib.ExitStack() as undo:
            check("rt.set_device", acl.rt.set_device(device_id))
            undo.callback(lambda: release("rt.reset_device", acl.rt.reset_device(device_id)))
            self.context = check("rt.create_context", acl.rt.create_context(device_id))
            undo.callback(lambda: release("rt.destroy_context", acl.rt.destroy_context(self.context)))
            self._mem_attr = self._pick_mem_attr()
            self._last_mem = check("rt.get_mem_info", acl.rt.get_mem_info(self._mem_attr))
            undo.pop_all()
        streams, events = limits or limits_for_soc(None)
        # a context's streams as this SoC makes them (the CPU runtime's: as the SoC it presents)
        self.ledger = DeviceLedger(device_id, streams, events, context_streams(soc_name(acl)), limits_remedy)
        self._promised = 0  # bytes that room() holds for allocations not made yet (under _lock)
        self.health = DeviceHealth(acl, device_id, on_failure)
        self._closed = False

    def _pick_mem_attr(self) -> int:
        # HBM on Atlas 300I Duo/910-class cards, DDR on 310-class boards: use whichever reports memory.
        for attr in (C.ACL_HBM_MEM, C.ACL_DDR_MEM):
            try:
                _, total = check("rt.get_mem_info", self._acl.rt.get_mem_info(attr))
            except AclError:
                continue  # this kind of memory is absent here
            if total > 0:
                return attr
        return C.ACL_HBM_MEM

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory, read now (an ACL call: not on the event loop)."""
        with self._lock:
            return self._read_mem_info()

    def _read_mem_info(self) -> tuple[int, int]:
        with using_context(self._acl, self.context):
            self._last_mem = check("rt.get_mem_info", self._acl.rt.get_mem_info(self._mem_attr))
            return self._last_mem

    def cached_mem_info(self) -> tuple[int, int]:
        """The figures of the last mem_info() (taken at open, each load and each refresh); no ACL call."""
        return self._last_mem

    @contextlib.contextmanager
    def room(self, what: str, sizes: Iterable[int]):
        """Room for HUGE_FIRST allocations of these sizes (each counted as the device takes it:
        device_bytes), promised to the block that makes them: LoadError if they would eat into
        the memory reserve. Loads run in parallel (load_threads): the free figure still shows
        what another load, past its check, has yet to allocate, so what is promised is taken off
        it. The block says `took(size)` after each allocation (the free figure shows it from
        then on); what it did not take is given back when it ends."""
        needed = sum(device_bytes(size) for size in sizes if size)
        with self._lock:  # read under it: a load ending its block in between would be missed
            free, total = self._read_mem_info()
            reserve = int(total * self.memory_reserve_fraction)
            promised = self._promised
            if needed > total:  # (no unload nor reserve makes room: a tester was told to unload)
                raise NoRoom(f"{what} needs {needed:,} bytes of device {self.id} memory, more than the device's "
                             f"whole memory ({total:,} bytes): " + self._larger_memory_remedy())
            if needed > total - reserve:  # (nor does any unload: it was told to unload a model)
                raise NoRoom(f"{what} needs {needed:,} bytes of device {self.id} memory, more than the device's "
                             f"memory less its reserve ({total - reserve:,} of {total:,} bytes, "
                             f"{self.memory_reserve_fraction:.0%} held in reserve): no unload makes room; lower "
                             "memory_reserve_fraction, or " + self._larger_memory_remedy())
            if needed > free - reserve - promised:
                held = f", {promised:,} promised to loads under way" if promised else ""
                facts = (f"{what} needs {needed:,} bytes of device {self.id} memory but only {free:,} of "
                         f"{total:,} are free{held} and {reserve:,} are held in reserve "
                         f"({self.memory_reserve_fraction:.0%})")
                if needed <= free - reserve:
                    raise RoomPromised(f"{facts}; tried again later")
                error = NoRoom(facts, "unload a model or lower memory_reserve_fraction")
                error.device, error.needed = self, needed  # (an unload there may make room: the load waits for it)
                raise error
            self._promised += needed
        left = needed

        def took(size: int) -> None:
            nonlocal left
            with self._lock:
                taken = min(device_bytes(size), left)
                left -= taken
                self._promised -= taken

        try:
            yield took
        finally:
            with self._lock:
                self._promised -= left

    def memory_back(self, needed: int, free_then: int) -> bool:
        """Whether `needed` bytes fit the free figure last read (cached_mem_info: read again as each
        instance here is freed, InstanceResources.release), beside the reserve and the room promised,
        and that figure has grown past `free_then` (the refusal's, once the refused load let go of its
        own: its give-back alone makes no room for it). No ACL call: for the event loop."""
        free, total = self._last_mem
        with self._lock:
            promised = self._promised
        return free > free_then and needed <= free - int(total * self.memory_reserve_fraction) - promised

    def _larger_memory_remedy(self) -> str:
        smaller = "make it smaller (a smaller model or largest batch size)"
        if self._cpu_memory:
            return f"raise ACLSERVE_CPU_DEVICE_MEMORY (the CPU runtime's device memory), or {smaller}"
        return f"load it on a device with more memory, or {smaller}"

    def close(self, reset: bool = True) -> None:
        """Destroy the management context and reset the device; without `reset` (a device still
        running an abandoned instance's work, or an instance being closed, rebuilt or loaded on
        it: runtime/teardown.py) the device is left as it is, management context included (a
        load that returns later still reads memory figures through it)."""
        if self._closed:
            return
        self._closed = True
        if not reset:
            log.warning("device %d not reset: it still runs the work of an instance abandoned (or being "
                        "closed, rebuilt or loaded)", self.id)
            return
        acl = self._acl
        with using_context(acl, self.context):
            release("rt.destroy_context", acl.rt.destroy_context(self.context))
        self.context = 0
        with restoring_context(acl):  # reset_device may unbind the default context from this thread
            release("rt.reset_device", acl.rt.reset_device(self.id))
