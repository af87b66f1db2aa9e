"""aclDataBuffer and aclmdlDataset: host-side descriptors of device memory.

A data buffer is (address, size) and owns no memory; a dataset is a list of data buffers and
owns none of them (destroy_dataset leaves the buffers, destroy_data_buffer leaves the memory).
A dataset also keeps the gear set_dynamic_batch_size last set on it, which an execution runs
with (the device's aclmdlDataset.dynamicBatchSize: hicann/ge model.cpp). An execution takes its
buffers' (address, size) pairs at the call (`Dataset.blobs`), as ModelExecute copies them into
GE's InputData/OutputData blobs: a later update_data_buffer is not that execution's.
"""
from __future__ import annotations

import threading
from typing import NamedTuple

from .. import constants as C
from . import _state


class DataBuffer:
    __slots__ = ("handle", "addr", "size")

    def __init__(self, addr: int, size: int):
        self.handle = _state.new_handle()
        self.addr, self.size = addr, size


class Blob(NamedTuple):
    """A data buffer's address and size as an execution took them."""
    addr: int
    size: int


class Dataset:
    __slots__ = ("handle", "buffers", "gear")

    def __init__(self):
        self.handle = _state.new_handle()
        self.buffers: list[DataBuffer] = []
        self.gear = 0  # set_dynamic_batch_size's batch on this dataset; 0: never set

    def blobs(self) -> tuple[Blob, ...]:
        return tuple([Blob(b.addr, b.size) for b in self.buffers])


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
    buf = buffers.get(handle)
    if buf is None or addr < 0 or size < 0:
        return C.ACL_ERROR_INVALID_PARAM
    buf.addr, buf.size = addr, size
    return C.ACL_SUCCESS


def destroy_data_buffer(handle: int) -> int:
    with _lock:
        return C.ACL_SUCCESS if buffers.pop(handle, None) is not None else C.ACL_ERROR_INVALID_PARAM


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
    if ds is None or not 0 <= index < len(ds.buffers):
        return 0
    return ds.buffers[index].handle


def destroy_dataset(ds_handle: int) -> int:
    with _lock:
        return C.ACL_SUCCESS if datasets.pop(ds_handle, None) is not None else C.ACL_ERROR_INVALID_PARAM
