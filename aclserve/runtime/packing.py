"""Rows in and out of a slot's host buffers: the requests of a batch packed one after another
(padding rows copies of the last real row), and each request's own output rows copied back out."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from .batch import Batch
from .slot import Slot


def pack(slot: Slot, batch: Batch) -> int:
    """Copy the requests' rows into the slot's host buffers and fill the padding; return the rows to run.
    Padding repeats the last real row, not zeros: a row the model can run for sure (a model dividing
    by an input failed every padded batch on zeros; its answers are dropped either way)."""
    rows = batch.gear if batch.gear is not None else batch.rows
    real = batch.rows
    for tensor in slot.inputs:
        name = tensor.spec.name
        view = tensor.rows_view
        if not tensor.spec.batched:  # no batch dimension: one request fills the whole tensor
            view[...] = batch.inputs[0][name]
            continue
        if len(batch.inputs) == 1:
            view[:real] = batch.inputs[0][name]
        else:
            np.concatenate([r[name] for r in batch.inputs], axis=0, out=view[:real])
        if real < rows:
            view[real:rows] = view[real - 1]
    return rows


def copy_bytes(tensor, rows: int) -> int:
    """Bytes to copy for `rows` rows of a slot tensor (all of it when it has no batch dimension)."""
    return tensor.row_bytes * rows if tensor.spec.batched else tensor.size


SHARED_COPY_BYTES = 64 * 1024  # a batch output up to this size is copied once for all its requests


def unpack(slot: Slot, batch: Batch) -> list[dict[str, np.ndarray]]:
    """Each request's own output rows, copied out of the slot (which is reused at once). An
    output of at most SHARED_COPY_BYTES for the batch's rows is copied once and its requests get
    views of that copy (a batch of 32 light requests: one copy, not 32); larger ones are copied
    per request, so that an answer kept long (a slow client) does not keep the whole batch's."""
    real = batch.rows
    shared = {}
    for t in slot.outputs:
        if t.spec.batched and t.row_bytes * real <= SHARED_COPY_BYTES:
            shared[t.spec.name] = t.rows_view[:real].copy()
    outputs: list[dict[str, np.ndarray]] = []
    offset = 0
    for request in batch.inputs:
        n = _rows_of(request, batch)
        outputs.append({t.spec.name: _rows(t, shared, offset, n) for t in slot.outputs})
        offset += n
    return outputs


def _rows(tensor, shared: dict[str, np.ndarray], offset: int, n: int) -> np.ndarray:
    rows = shared.get(tensor.spec.name)
    if rows is not None:
        return rows[offset: offset + n]
    return tensor.rows_view[offset: offset + n].copy() if tensor.spec.batched else tensor.rows_view.copy()


def _rows_of(request: Mapping[str, np.ndarray], batch: Batch) -> int:
    if batch.gear is None:
        return batch.rows
    return len(next(iter(request.values())))
