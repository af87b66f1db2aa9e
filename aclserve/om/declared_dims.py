"""Sizes a config declares for an .onnx's inputs (a config.pbtxt's dims, or its reshape, the shape
the model takes: repository/loader.py), given to the dimensions the model leaves variable but its
batch dimension, as --input-shape would give them: an OM runs fixed sizes, and Triton's model
takes the config's size there (a model of [N, L] under dims [ 5 ] is served 5 values a row).

The model's own inputs are rewritten before the compile resolves them (spec.resolve), so a
dimension the model fixes keeps its size (one the config contradicts is repository/declared.py's
to refuse, naming the field), the batch dimension stays the batch, and an input --input-shape
names keeps that shape. Declared dims are a row's, after the batch dimension (the caller drops
the first of dims that hold it: max_batch_size 0 and both lists given), and line up with the
model's dims after its first; on a model whose first dimension is fixed (no batch dimension) they
may be its whole shape. Others are left alone: dims of the model's full rank on a model with a
batch dimension do not size it (repository/declared.py refuses them, quoting the model's own
shape, not one they gave it), nor does a variable size declared -1 (the compile then says the
dimension is variable)."""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import onnx


def fill_declared(inputs: Iterable[onnx.ValueInfoProto], declared: Mapping[str, Sequence[int]],
                  given: Iterable[str] = ()) -> None:
    """Set each variable dimension but the first of `inputs` (the model's, rewritten in place) that
    `declared` sizes (a row's each), for the inputs not `given` a shape otherwise (--input-shape)."""
    skip = set(given)
    for vi in inputs:
        sizes = declared.get(vi.name)
        if sizes is None or vi.name in skip or not vi.type.tensor_type.HasField("shape"):
            continue
        dims = vi.type.tensor_type.shape.dim
        if len(sizes) == len(dims) - 1:  # a row's: after the batch dimension
            sizes = [-1, *sizes]
        elif len(sizes) != len(dims) or not (dims and _fixed(dims[0])):  # (whole only without a batch dimension)
            continue
        for axis, (dim, size) in enumerate(zip(dims, sizes)):
            if axis and size > 0 and not _fixed(dim):
                dim.Clear()
                dim.dim_value = size


def _fixed(dim) -> bool:
    """A dimension of a fixed size (a negative one is variable, as ONNX Runtime reads it: spec.dims_of)."""
    return dim.HasField("dim_value") and dim.dim_value >= 0
