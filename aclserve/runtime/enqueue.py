"""The ACL call sequences that put one batch on the device and take its outputs off, for a
ModelInstance's launcher thread (launcher.py) and its synchronous baseline (run_sync), under
the instance's context:

    piped       the launcher packs, then queues everything: H2D copies on the h2d stream,
                the execution on the compute stream (after h2d_end), D2H copies on the d2h
                stream (after exec_end), each phase between two of the slot's events
    direct      a batch alone in flight: the same copies and execution, all on the compute
                stream, the copies without events of their own (nothing to overlap with, and
                the copy streams' two wake-ups are saved); still asynchronous, so the
                completion thread's timed wait bounds a hung copy too (a synchronous memcpy
                cannot be timed out)
    synchronous pack, memcpy, blocking execute, memcpy (the unpipelined benchmark baseline)

A traced batch gets its host marks here (packed, copies, enqueued). Every call goes through
check(); nothing here waits on an event (the instance's completion thread does: completer.py).
"""
from __future__ import annotations

import time

from ..acl import check
from ..acl import constants as C
from ..trace.records import now_ns
from .batch import Batch
from .om_model import OmModel
from .packing import copy_bytes, pack
from .slot import Slot


def piped(acl, model: OmModel, streams: dict[str, int], slot: Slot, batch: Batch) -> None:
    rt = acl.rt
    rows = pack(slot, batch)
    if batch.trace is not None:
        batch.trace.packed_ns = now_ns()
    h2d, compute, d2h = streams["h2d"], streams["compute"], streams["d2h"]
    ev = slot.events
    copies_in(acl, slot, rows, h2d)
    check("rt.stream_wait_event", rt.stream_wait_event(compute, ev["h2d_end"]))
    execution(acl, model, slot, batch, compute)
    check("rt.stream_wait_event", rt.stream_wait_event(d2h, ev["exec_end"]))
    copies_out(acl, slot, rows, d2h)
    if batch.trace is not None:
        batch.trace.enqueued_ns = now_ns()


def direct(acl, model: OmModel, compute: int, slot: Slot, batch: Batch) -> None:
    """A batch alone in flight: pack, then everything in order on the compute stream (no
    cross-stream waits, no copy-stream wake-ups): h2d_start, the input copies, the execution
    between exec_start and exec_end, the output copies, d2h_end. The copies are timed by the
    events around them (h2d_start..exec_start, exec_end..d2h_end: event_times.py) and have no
    end events of their own (a failed input copy is reported by exec_start): two event records
    fewer than the piped layout, about 0.015 ms a lone batch on the CPU runtime."""
    rows = pack(slot, batch)
    if batch.trace is not None:
        batch.trace.packed_ns = now_ns()
    check("rt.record_event", acl.rt.record_event(slot.events["h2d_start"], compute))
    _copies(acl, slot.inputs, rows, C.ACL_MEMCPY_HOST_TO_DEVICE, compute)
    execution(acl, model, slot, batch, compute)
    _copies(acl, slot.outputs, rows, C.ACL_MEMCPY_DEVICE_TO_HOST, compute)
    check("rt.record_event", acl.rt.record_event(slot.events["d2h_end"], compute))
    if batch.trace is not None:
        batch.trace.enqueued_ns = now_ns()


def copies_in(acl, slot: Slot, rows: int, stream: int) -> None:
    """Queue the input copies on `stream` between h2d_start and h2d_end."""
    rt, ev = acl.rt, slot.events
    check("rt.record_event", rt.record_event(ev["h2d_start"], stream))
    _copies(acl, slot.inputs, rows, C.ACL_MEMCPY_HOST_TO_DEVICE, stream)
    check("rt.record_event", rt.record_event(ev["h2d_end"], stream))


def copies_out(acl, slot: Slot, rows: int, stream: int) -> None:
    """Queue the output copies on `stream` between d2h_start and d2h_end."""
    rt, ev = acl.rt, slot.events
    check("rt.record_event", rt.record_event(ev["d2h_start"], stream))
    _copies(acl, slot.outputs, rows, C.ACL_MEMCPY_DEVICE_TO_HOST, stream)
    check("rt.record_event", rt.record_event(ev["d2h_end"], stream))


def _copies(acl, tensors, rows: int, kind: int, stream: int) -> None:
    """memcpy_async of each tensor's first `rows` rows: host to device, or back."""
    to_device = kind == C.ACL_MEMCPY_HOST_TO_DEVICE
    for tensor in tensors:
        dst, src = (tensor.device, tensor.host) if to_device else (tensor.host, tensor.device)
        check("rt.memcpy_async", acl.rt.memcpy_async(dst, tensor.size, src, copy_bytes(tensor, rows), kind, stream))


def execution(acl, model: OmModel, slot: Slot, batch: Batch, compute: int) -> None:
    """Set the gear (an immediate write into the slot's own dataset) and queue the execution
    between the slot's exec_start and exec_end events on the compute stream."""
    rt, ev = acl.rt, slot.events
    if batch.gear is not None:
        check("mdl.set_dynamic_batch_size", acl.mdl.set_dynamic_batch_size(
            model.model_id, slot.input_dataset, model.dynamic_index, batch.gear))
    check("rt.record_event", rt.record_event(ev["exec_start"], compute))
    check("mdl.execute_async", acl.mdl.execute_async(model.model_id, slot.input_dataset, slot.output_dataset, compute))
    check("rt.record_event", rt.record_event(ev["exec_end"], compute))


def synchronous(acl, model: OmModel, slot: Slot, batch: Batch) -> float:
    """Pack, copy in, execute (blocking), copy out; returns the execute's wall time in ms."""
    rows = pack(slot, batch)
    copy_in(acl, slot, rows)
    if batch.gear is not None:
        check("mdl.set_dynamic_batch_size", acl.mdl.set_dynamic_batch_size(
            model.model_id, slot.input_dataset, model.dynamic_index, batch.gear))
    start = time.perf_counter_ns()
    check("mdl.execute", acl.mdl.execute(model.model_id, slot.input_dataset, slot.output_dataset))
    compute_ms = (time.perf_counter_ns() - start) / 1e6  # a blocking execute: its wall time
    copy_out(acl, slot, rows)
    return compute_ms


def copy_in(acl, slot: Slot, rows: int) -> None:
    for tensor in slot.inputs:
        check("rt.memcpy", acl.rt.memcpy(tensor.device, tensor.size, tensor.host,
                                         copy_bytes(tensor, rows), C.ACL_MEMCPY_HOST_TO_DEVICE))


def copy_out(acl, slot: Slot, rows: int) -> None:
    for tensor in slot.outputs:
        check("rt.memcpy", acl.rt.memcpy(tensor.host, tensor.size, tensor.device,
                                         copy_bytes(tensor, rows), C.ACL_MEMCPY_DEVICE_TO_HOST))
