"""One buffer set of a model instance: everything a batch in flight needs, owned together.

A slot holds, per real input, a host staging buffer (malloc_host) and a device buffer sized for
the largest gear (HUGE_FIRST); the dynamic-batch buffer; per output a device and a host buffer;
its own input and output datasets (set_dynamic_batch_size writes into the dataset at once and
is not ordered on a stream, so datasets are never shared between slots in flight); and six
events timing H2D, compute and D2H. Create and close it with the instance's context current.
"""
from __future__ import annotations

import contextlib
import ctypes

import numpy as np

from ..acl import check, check_handle, compat, release
from ..acl import constants as C
from .om_model import OmModel
from .types import TensorSpec


def host_view(ptr: int, nbytes: int) -> np.ndarray:
    """A uint8 numpy view of host memory at `ptr` (no copy); the caller keeps the memory alive."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))


# memcpy_async wants both addresses 64-byte aligned (CANN); malloc_host's memory is page-aligned
# on a host but need not be on the board (ACL_DEVICE), so each host buffer is allocated this
# much larger and used from its first aligned byte
COPY_ALIGN = 64


class _Tensor:
    __slots__ = ("spec", "size", "host", "host_block", "device", "buffer", "rows_view", "row_bytes")

    def __init__(self, spec: TensorSpec | None, size: int):
        self.spec, self.size = spec, size
        self.host = self.host_block = self.device = self.buffer = 0  # host_block: what malloc_host gave
        self.rows_view: np.ndarray | None = None
        self.row_bytes = 0


class Slot:
    """Owns: host and device buffers, data buffers, two datasets, six events (see module doc)."""

    EVENTS = ("h2d_start", "h2d_end", "exec_start", "exec_end", "d2h_start", "d2h_end")

    def __init__(self, acl, model: OmModel, index: int):
        self._acl = acl
        self.index = index
        self.inputs: list[_Tensor] = []
        self.outputs: list[_Tensor] = []
        self.events: dict[str, int] = {}
        # its events may be waited on by another stream batch after batch (compat.pipeline_event);
        # else each batch runs on one stream (enqueue.direct)
        self.cross_stream = False
        self.input_dataset = self.output_dataset = 0
        self._tensors: list[_Tensor] = []
        self._closed = False
        with contextlib.ExitStack() as undo:
            undo.callback(self.close)
            self._build(model)
            undo.pop_all()

    def _build(self, model: OmModel) -> None:
        acl = self._acl
        rows = model.buffer_rows
        self.input_dataset = check_handle("mdl.create_dataset", acl.mdl.create_dataset())
        specs = dict(zip(model.input_indices, model.inputs))
        for i, size in enumerate(model.input_sizes):
            spec = specs.get(i)  # None for the dynamic-batch input: device buffer only, never filled
            tensor = self._tensor(spec, size, rows, host=spec is not None)
            check("mdl.add_dataset_buffer", acl.mdl.add_dataset_buffer(self.input_dataset, tensor.buffer))
            if spec is not None:
                self.inputs.append(tensor)
        self.output_dataset = check_handle("mdl.create_dataset", acl.mdl.create_dataset())
        for spec, size in zip(model.outputs, model.output_sizes):
            tensor = self._tensor(spec, size, rows, host=True)
            check("mdl.add_dataset_buffer", acl.mdl.add_dataset_buffer(self.output_dataset, tensor.buffer))
            self.outputs.append(tensor)
        shared = []
        for name in self.EVENTS:
            self.events[name], reusable = compat.pipeline_event(acl)
            shared.append(reusable)
        self.cross_stream = all(shared)

    def _tensor(self, spec: TensorSpec | None, size: int, rows: int, host: bool) -> _Tensor:
        acl = self._acl
        tensor = _Tensor(spec, size)
        self._tensors.append(tensor)
        tensor.device = check("rt.malloc", acl.rt.malloc(size, C.ACL_MEM_MALLOC_HUGE_FIRST))
        tensor.buffer = check_handle("create_data_buffer", acl.create_data_buffer(tensor.device, size))
        if host:
            tensor.host_block = check("rt.malloc_host", acl.rt.malloc_host(size + COPY_ALIGN - 1))
            tensor.host = -(-tensor.host_block // COPY_ALIGN) * COPY_ALIGN
            tensor.row_bytes = size // rows
            raw = host_view(tensor.host, size)
            shape = (rows,) + tuple(spec.sample_shape) if spec.batched else tuple(spec.shape)
            tensor.rows_view = raw[: int(np.prod(shape, dtype=np.int64)) * spec.dtype.itemsize].view(
                spec.dtype).reshape(shape)
        return tensor

    def close(self) -> None:
        """Destroy events, datasets, data buffers; free device and host memory. Safe twice."""
        if self._closed:
            return
        self._closed = True
        acl = self._acl
        for event in self.events.values():
            release("rt.destroy_event", acl.rt.destroy_event(event))
        self.events.clear()
        for dataset in (self.input_dataset, self.output_dataset):
            if dataset:
                release("mdl.destroy_dataset", acl.mdl.destroy_dataset(dataset))  # not its buffers
        self.input_dataset = self.output_dataset = 0
        for tensor in self._tensors:
            tensor.rows_view = None
            if tensor.buffer:
                release("destroy_data_buffer", acl.destroy_data_buffer(tensor.buffer))  # not the memory
            if tensor.device:
                release("rt.free", acl.rt.free(tensor.device))
            if tensor.host_block:
                release("rt.free_host", acl.rt.free_host(tensor.host_block))
            tensor.buffer = tensor.device = tensor.host = tensor.host_block = 0
        self._tensors.clear()
