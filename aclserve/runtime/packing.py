"""Rows in and out of a slot's host buffers: the requests of a batch packed one after another
(padding rows zeroed), and each request's own output rows copied back out."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from .batch import Batch
from .slot import Slot


def pack(slot: Slot, batch: Batch) -> int:
    """Copy the requests' rows into the slot's host buffers, zero the padding; return the rows to run."""
    rows = batch.gear if batch.gear is not None else batch.rows
    real = batch.rows
    for tensor in slot.inputs:
        name = tensor.spec.name
        view = tensor.rows_view
        if len(batch.inputs) == 1:
            view[:real] = batch.inputs[0][name]
        else:
            np.concatenate([r[name] for r in batch.inputs], axis=0, out=view[:real])
        if real < rows:
            view[real:rows] = 0
    return rows


def copy_bytes(tensor, rows: int) -> int:
    """Bytes to copy for `rows` rows of a slot tensor (all of it when it has no batch dimension)."""
    return tensor.row_bytes * rows if tensor.spec.batched else tensor.size


def unpack(slot: Slot, batch: Batch) -> list[dict[str, np.ndarray]]:
    """Each request's own output rows, copied out of the slot (which is reused at once)."""
    outputs: list[dict[str, np.ndarray]] = []
    offset = 0
    for request in batch.inputs:
        n = _rows_of(request, batch)
        outputs.append({t.spec.name: (t.rows_view[offset: offset + n].copy() if t.spec.batched
                                      else t.rows_view.copy()) for t in slot.outputs})
        offset += n
    return outputs


def _rows_of(request: Mapping[str, np.ndarray], batch: Batch) -> int:
    if batch.gear is None:
        return batch.rows
    return len(next(iter(request.values())))
