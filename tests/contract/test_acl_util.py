"""acl.util pointer helpers."""
from __future__ import annotations

import numpy as np
import pytest


def test_bytes_and_pointers_round_trip(acl):
    data = b"pyACL bytes \x00\x01\x02"
    ptr = acl.util.bytes_to_ptr(data)
    assert ptr != 0
    assert acl.util.ptr_to_bytes(ptr, len(data)) == data


def test_numpy_pointers_share_memory(acl):
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    ptr = acl.util.numpy_to_ptr(array)
    assert ptr == array.ctypes.data
    view = acl.util.ptr_to_numpy(ptr, (3, 4), np.dtype(np.float32).num)
    assert view.shape == (3, 4) and view.dtype == np.float32
    np.testing.assert_array_equal(view, array)
    array[1, 2] = -1.0  # a view, not a copy
    assert view[1, 2] == -1.0
    with pytest.raises(TypeError):
        acl.util.ptr_to_numpy(ptr, [3, 4], np.dtype(np.float32).num)
