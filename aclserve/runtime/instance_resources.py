"""The ACL objects one ModelInstance owns, made in this order and freed streams first.

    context    made first; everything below is created under it (create_context makes it
               current, and the calling thread gets its previous context back afterwards)
    streams    h2d, compute, d2h, set to stop on a failed task where the CANN and SoC can
               (`stops_on_failure`; compat.stop_on_failure): else the instance has one slot,
               and the completion thread synchronizes the streams after each batch
    clock      a DeviceClock (device event times on the host clock, for traces)
    model      the instance's own OmModel copy (a model id is not re-entrant)
    slots      `slots` Slots, once the device has room for their buffers

A construction that fails frees what it made. release() frees everything under the context,
once the instance's threads have stopped and its streams are idle: the streams first, so that no
task is left on one to record or wait on the slots' or the clock's events, or to reach the slots'
buffers, once they are freed; then the slots, the clock and the model; the context last, as
everything was made under it. If the device still runs the instance's work then, nothing is
freed, since that work reads and writes the slots' memory (teardown.py abandons the instance,
and tries again later). The callbacks given to when_freed() run once everything is freed and the
device's memory figures are read again (the ledger's give-back they say is memory's too). The
instance's threads run under the context (start_thread); the completion thread recreates the
streams after a device fault (reset_streams), when nothing is in flight.
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterable

from ..acl import AclError, check, compat, release, restoring_context, using_context
from ..acl import constants as C
from . import teardown
from .device import Device
from .device_clock import DeviceClock
from .om_model import OmModel
from .slot import Slot


class InstanceResources:
    """Owns: an ACL context, three streams, a DeviceClock, an OmModel and its Slots."""

    def __init__(self, acl, device: Device, path: str, name: str, slots: int, reset_timeout_ms: int):
        self._acl = acl
        self.device = device
        self.name = name
        self.context = 0
        self.streams: dict[str, int] = {}
        self.clock: DeviceClock | None = None
        self.model: OmModel | None = None
        self.slots: list[Slot] = []
        self.stops_on_failure = False  # its streams stop on a failed task (_create_streams)
        self._when_freed: list = []  # callbacks run once everything here is freed
        with restoring_context(acl), contextlib.ExitStack() as undo:
            undo.callback(self._release_unfinished, reset_timeout_ms)
            self.context = check("rt.create_context", acl.rt.create_context(device.id))
            self._create_streams()
            if not self.stops_on_failure:
                slots = 1  # a failure is told from its streams only once nothing else runs on them
            self.clock = DeviceClock(acl)
            self.model = OmModel(acl, device, path, name)
            per_slot = [*self.model.input_sizes, *self.model.output_sizes]  # a malloc each
            with device.room(f"model {name} ({slots} slots of buffers)", per_slot * slots) as took:
                for i in range(slots):
                    self.slots.append(Slot(acl, self.model, i))
                    for size in per_slot:
                        took(size)
            undo.pop_all()

    def _release_unfinished(self, reset_timeout_ms: int) -> None:
        """A construction that failed frees what it made, waiting for the device as a close would."""
        deadline = time.monotonic() + reset_timeout_ms / 1000
        self.release((), lambda: deadline)

    def _create_streams(self) -> None:
        for role in ("h2d", "compute", "d2h"):
            self.streams[role] = check("rt.create_stream", self._acl.rt.create_stream())
        self.stops_on_failure = all(compat.stop_on_failure(self._acl, s) for s in self.streams.values())

    def start_thread(self, role: str, target: Callable[[], None]) -> threading.Thread:
        """A daemon thread named after the instance and `role`, running `target` under the context."""
        thread = threading.Thread(target=self._thread_main, args=(target,), name=f"{self.name}-{role}", daemon=True)
        thread.start()
        return thread

    def _thread_main(self, target: Callable[[], None]) -> None:
        check("rt.set_context", self._acl.rt.set_context(self.context))  # contexts are per thread
        target()

    def reset_streams(self, timeout_ms: int) -> None:
        """Drain and recreate the streams (their errors are cleared). Raises AclError when a
        stream is still busy after `timeout_ms` (the device is not coming back) or a stream
        cannot be destroyed or made again. The caller's thread holds the context."""
        rt = self._acl.rt
        for role, stream in list(self.streams.items()):
            try:
                compat.synchronize_stream(self._acl, stream, timeout_ms)
            except AclError as e:
                if e.ret == C.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT:
                    raise  # still busy: the device is not coming back
                # else the fault that brought us here; destroying the stream clears it
            check("rt.destroy_stream", rt.destroy_stream(stream))
            del self.streams[role]
        self._create_streams()

    def release(self, threads: Iterable[threading.Thread | None], deadline: Callable[[], float]) -> str | None:
        """Under the context: once `threads` have stopped and the streams are idle (waiting until
        `deadline()`, read again as it waits), destroy the streams, then free slots, clock and
        model, then destroy the context; the calling thread's context is restored. If the device
        still runs the instance's work then, nothing is freed and what runs is returned."""
        acl = self._acl
        if not self.context:
            return None
        with using_context(acl, self.context):
            running = teardown.still_running(acl, threads, self.streams, deadline, self.stops_on_failure)
            if running is not None:
                return running
            for stream in self.streams.values():
                release("rt.destroy_stream", acl.rt.destroy_stream(stream))
            self.streams.clear()
            while self.slots:
                self.slots.pop().close()
            if self.clock is not None:
                self.clock.close()
                self.clock = None
            if self.model is not None:
                self.model.close()
                self.model = None
            release("rt.destroy_context", acl.rt.destroy_context(self.context))
            self.context = 0
        with contextlib.suppress(AclError):  # (a figure not read again is only older: release() frees all the same)
            self.device.mem_info()  # read again before the give-back: a load waiting for memory looks at it
        callbacks, self._when_freed = self._when_freed, []
        for callback in callbacks:
            callback()
        return None

    def when_freed(self, callback: Callable[[], None]) -> None:
        """Run `callback` once everything here is freed (by release())."""
        self._when_freed.append(callback)
