"""acl.util for the CPU runtime: host pointers from Python objects, and report threads.

Pointer helpers work on raw addresses exactly like pyACL's: they do not own memory and do not
check it (a bad address is the caller's bug, as with the real module).
"""
from __future__ import annotations

import ctypes

import numpy as np

from .. import constants as C
from . import _callback
from ._args import ANY, FUNC, INT, PTR, TUPLE, api



def _numeric_dtypes() -> dict[int, np.dtype]:
    out = {}
    for code in np.typecodes["AllInteger"] + np.typecodes["AllFloat"] + "?":
        dtype = np.dtype(code)
        out.setdefault(dtype.num, dtype)
    return out


_TYPE_NUMS = _numeric_dtypes()


def bytes_to_ptr(data):
    """Address of a bytes object's buffer (no copy: keep `data` alive and do not write into it)."""
    if not isinstance(data, bytes):
        raise ValueError("acl.util.bytes_to_ptr: the argument must be bytes")
    return ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0


@api("acl.util.ptr_to_bytes", PTR, PTR)
def ptr_to_bytes(ptr, size):
    if ptr == 0 or size < 0:
        raise ValueError("acl.util.ptr_to_bytes: null pointer or negative size")
    return ctypes.string_at(ptr, size)


def numpy_to_ptr(array):
    """Address of an ndarray's data (no copy)."""
    if not isinstance(array, np.ndarray):
        raise TypeError("acl.util.numpy_to_ptr args parse failed")
    return array.ctypes.data


def numpy_contiguous_to_ptr(array):
    """(address, contiguous array): keep the returned array alive while the address is used."""
    if not isinstance(array, np.ndarray):
        raise TypeError("acl.util.numpy_contiguous_to_ptr args parse failed")
    contiguous = np.ascontiguousarray(array)
    return contiguous.ctypes.data, contiguous


@api("acl.util.ptr_to_numpy", PTR, TUPLE, INT)
def ptr_to_numpy(ptr, shape, npy_type):
    """Wrap memory at `ptr` as an ndarray of `shape` and numpy type number `npy_type` (no copy)."""
    dtype = _TYPE_NUMS.get(npy_type)
    if dtype is None or ptr == 0 or any(not isinstance(d, int) or d < 0 for d in shape):
        raise ValueError("acl.util.ptr_to_numpy: bad pointer, shape or numpy type number")
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(ptr)
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)


@api("acl.util.start_thread", FUNC, ANY)
def start_thread(fn, args_list):
    """(thread id, ret): run fn(args_list) in a new thread (a report thread for subscribe_report)."""
    return _callback.start_thread(fn, args_list), C.ACL_SUCCESS


@api("acl.util.stop_thread", PTR)
def stop_thread(thread_id):
    """Join the thread; RuntimeError if its function raised (as pyACL)."""
    return _callback.stop_thread(thread_id)
