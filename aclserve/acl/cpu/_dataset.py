"""aclDataBuffer and aclmdlDataset: host-side descriptors of device memory.

A data buffer is (address, size) and owns no memory; a dataset is a list of data buffers and
owns none of them (destroy_dataset leaves the buffers, destroy_data_buffer leaves the memory).
A dataset also keeps the gear set_dynamic_batch_size last set on it, which an execution runs
with (the device's aclmdlDataset.dynamicBatchSize: hicann/ge model.cpp). An execution takes its
buffers' (address, size) pairs at the call (`Dataset.blobs`), as ModelExecute copies them into
GE's InputData/OutputData blobs: a later update_data_buffer is not that execution's.

A buffer destroyed while a dataset still holds it is refused where the dataset would use it
(execute, execute_async, set_dynamic_batch_size, get_dataset_buffer: 100000, as for any other
destroyed handle): on a device the dataset keeps the freed aclDataBuffer* and ModelExecute reads
it after the free. The mark is its `blob` gone, which `Dataset.blobs` reads anyway.
"""
from __future__ import annotations

import threading
from typing import NamedTuple

from .. import constants as C
from . import _state


class Blob(NamedTuple):
    """A data buffer's address and size as an execution took them."""
    addr: int
    size: int


class DataBuffer:
    __slots__ = ("handle", "blob")

    def __init__(self, addr: int, size: int):
        self.handle = _state.new_handle()
        self.blob: Blob | None = Blob(addr, size)  # None once destroyed

    @property
    def addr(self) -> int:  # (0 once destroyed, as get_data_buffer_addr answers an unknown handle)
        blob = self.blob
        return blob.addr if blob is not None else 0

    @property
    def size(self) -> int:
        blob = self.blob
        return blob.size if blob is not None else 0

    @property
    def destroyed(self) -> bool:
        return self.blob is None


class Dataset:
    __slots__ = ("handle", "buffers", "gear")

    def __init__(self):
        self.handle = _state.new_handle()
        self.buffers: list[DataBuffer] = []
        self.gear = 0  # set_dynamic_batch_size's batch on this dataset; 0: never set

    def blobs(self) -> tuple[Blob, ...] | None:
        """Its buffers' (address, size) now; None when one of them was destroyed."""
        blobs = tuple([b.blob for b in self.buffers])
        return None if None in blobs else blobs

    def destroyed_index(self) -> int | None:
        """The index of its first destroyed buffer, if any (to say which, once blobs() said None)."""
        return next((i for i, b in enumerate(self.buffers) if b.destroyed), None)


_lock = threading.Lock()
buffers: dict[int, DataBuffer] = {}
datasets: dict[int, Dataset] = {}


def create_data_buffer(addr: int, size: int) -> int:
    if addr < 0 or size < 0:
        return 0
    buf = DataBuffer(addr, size)
    with _lock:
        buffers[buf.handle] = buf
    return buf.handle


def update_data_buffer(handle: int, addr: int, size: int) -> int:
    if addr < 0 or size < 0:
        return C.ACL_ERROR_INVALID_PARAM
    with _lock:  # (not to bring back to life a buffer destroyed meanwhile)
        buf = buffers.get(handle)
        if buf is None:
            return C.ACL_ERROR_INVALID_PARAM
        buf.blob = Blob(addr, size)
    return C.ACL_SUCCESS


def destroy_data_buffer(handle: int) -> int:
    with _lock:
        buf = buffers.pop(handle, None)
        if buf is None:
            return C.ACL_ERROR_INVALID_PARAM
        buf.blob = None  # a dataset holding it no longer runs (see the module's docstring)
    return C.ACL_SUCCESS


def create_dataset() -> int:
    ds = Dataset()
    with _lock:
        datasets[ds.handle] = ds
    return ds.handle


def add_dataset_buffer(ds_handle: int, buf_handle: int) -> tuple[int, int]:
    ds, buf = datasets.get(ds_handle), buffers.get(buf_handle)
    if ds is None or buf is None:
        return ds_handle, C.ACL_ERROR_INVALID_PARAM
    ds.buffers.append(buf)
    return ds_handle, C.ACL_SUCCESS


def num_buffers(ds_handle: int) -> int:
    ds = datasets.get(ds_handle)
    return len(ds.buffers) if ds is not None else 0


def get_buffer(ds_handle: int, index: int) -> int:
    ds = datasets.get(ds_handle)
    if ds is None or not 0 <= index < len(ds.buffers) or ds.buffers[index].destroyed:
        return 0
    return ds.buffers[index].handle


def destroy_dataset(ds_handle: int) -> int:
    with _lock:
        return C.ACL_SUCCESS if datasets.pop(ds_handle, None) is not None else C.ACL_ERROR_INVALID_PARAM
