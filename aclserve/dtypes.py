"""Tensor element types under their three names: the ACL data-type code (pyACL's aclDataType,
also what an OM header stores), the numpy dtype, and the KServe v2 datatype name.

Imports only numpy and sits below every package, so the file formats (om/), the ACL layer, the
server and the CLI read one table without importing each other.
"""
from __future__ import annotations

import numpy as np

# aclDataType (CANN acl_base.h); acl/constants.py re-exports these with pyACL's other enums
ACL_DT_UNDEFINED = -1
ACL_FLOAT = 0
ACL_FLOAT16 = 1
ACL_INT8 = 2
ACL_INT32 = 3
ACL_UINT8 = 4
ACL_INT16 = 6
ACL_UINT16 = 7
ACL_UINT32 = 8
ACL_INT64 = 9
ACL_UINT64 = 10
ACL_DOUBLE = 11
ACL_BOOL = 12
# the rest of aclDataType, which aclserve does not serve (CANN's aclDataType page, hicann/runtime
# docs/api_docs/aclDataType.md; HIFLOAT4 from its runtime source, aclDataTypeSize's switch)
ACL_STRING = 13
ACL_COMPLEX64 = 16
ACL_COMPLEX128 = 17
ACL_BF16 = 27
ACL_INT4 = 29
ACL_UINT1 = 30
ACL_COMPLEX32 = 33
ACL_HIFLOAT8 = 34
ACL_FLOAT8_E5M2 = 35
ACL_FLOAT8_E4M3FN = 36
ACL_FLOAT8_E8M0 = 37
ACL_FLOAT6_E3M2 = 38
ACL_FLOAT6_E2M3 = 39
ACL_FLOAT4_E2M1 = 40
ACL_FLOAT4_E1M2 = 41
ACL_HIFLOAT4 = 42

# every aclDataType code by its name in CANN's enum, less the ACL_ prefix: what a refusal names
ACL_TYPE_NAMES = {code: name[4:] for name, code in globals().items()
                  if name.startswith("ACL_") and type(code) is int}

_ACL_TO_NUMPY = {
    ACL_FLOAT: np.dtype(np.float32),
    ACL_FLOAT16: np.dtype(np.float16),
    ACL_INT8: np.dtype(np.int8),
    ACL_INT32: np.dtype(np.int32),
    ACL_UINT8: np.dtype(np.uint8),
    ACL_INT16: np.dtype(np.int16),
    ACL_UINT16: np.dtype(np.uint16),
    ACL_UINT32: np.dtype(np.uint32),
    ACL_INT64: np.dtype(np.int64),
    ACL_UINT64: np.dtype(np.uint64),
    ACL_DOUBLE: np.dtype(np.float64),
    ACL_BOOL: np.dtype(np.bool_),
}
_NUMPY_TO_ACL = {v: k for k, v in _ACL_TO_NUMPY.items()}

_ACL_TO_KSERVE = {
    ACL_FLOAT: "FP32", ACL_FLOAT16: "FP16", ACL_DOUBLE: "FP64",
    ACL_INT8: "INT8", ACL_INT16: "INT16", ACL_INT32: "INT32", ACL_INT64: "INT64",
    ACL_UINT8: "UINT8", ACL_UINT16: "UINT16", ACL_UINT32: "UINT32", ACL_UINT64: "UINT64",
    ACL_BOOL: "BOOL",
}
_KSERVE_TO_ACL = {v: k for k, v in _ACL_TO_KSERVE.items()}


def acl_type(acl_dtype: int) -> str:
    """`ACL data type 27 (BF16)`: the code with its aclDataType name (a bare 27 sent a reader to
    CANN's headers), or saying that CANN names no such type."""
    name = ACL_TYPE_NAMES.get(acl_dtype)
    return f"ACL data type {acl_dtype} ({name or 'not one of aclDataType'})"


def acl_to_numpy(acl_dtype: int) -> np.dtype:
    try:
        return _ACL_TO_NUMPY[acl_dtype]
    except KeyError:
        raise ValueError(f"{acl_type(acl_dtype)} has no numpy equivalent") from None


def numpy_to_acl(dtype) -> int:
    try:
        return _NUMPY_TO_ACL[np.dtype(dtype)]
    except KeyError:
        raise ValueError(f"numpy dtype {np.dtype(dtype)} has no ACL equivalent") from None


def acl_to_kserve(acl_dtype: int) -> str:
    try:
        return _ACL_TO_KSERVE[acl_dtype]
    except KeyError:
        raise ValueError(f"{acl_type(acl_dtype)} has no KServe datatype") from None


def kserve_to_acl(name: str) -> int:
    try:
        return _KSERVE_TO_ACL[name]
    except KeyError:
        raise ValueError(f"unknown datatype {name!r}") from None


def kserve_to_numpy(name: str) -> np.dtype:
    return acl_to_numpy(kserve_to_acl(name))


def numpy_to_kserve(dtype) -> str:
    return acl_to_kserve(numpy_to_acl(dtype))


def castable(source: np.dtype, target: np.dtype) -> bool:
    """Whether cast_keeping_values takes `source` to `target`: numpy's same_kind rule, and integers
    of either sign to integers or to bool (numpy calls int64 -> uint8 unsafe; the values decide)."""
    return np.can_cast(source, target, casting="same_kind") or (source.kind in "iu" and target.kind in "iub")


def cast_keeping_values(arr: np.ndarray, target: np.dtype) -> np.ndarray:
    """`arr` as `target` where `castable` (float64 -> float32, int64 -> int32 or uint8, integers
    -> a float, 0 and 1 -> bool), refused with ValueError when the cast would change what a value
    is rather than round it: floats to integers, an integer past the target's range (it wrapped),
    a finite number that rounds to inf in the target float (65520 or more for float16: 65519.99 rounds
    to its largest, 65504, as the server's JSON path rounds it)."""
    target = np.dtype(target)
    if arr.dtype == target:
        return arr
    if not castable(arr.dtype, target):  # 1.7 -> 1, NaN -> any int
        raise ValueError(f"is {arr.dtype}, the model takes {target}: a cast would change its values; convert it first")
    if target.kind in "iub" and arr.dtype.kind in "iub" and arr.size:
        bottom, top = (0, 1) if target.kind == "b" else (np.iinfo(target).min, np.iinfo(target).max)
        low, high = arr.min(), arr.max()
        if low < bottom or high > top:
            raise ValueError(f"holds {low if low < bottom else high}, outside {target}'s range "
                             f"[{bottom}, {top}]: convert it first")
    with np.errstate(over="ignore"):
        cast = arr.astype(target)
    if target.kind == "f" and arr.size:
        overflowed = np.isinf(cast) & np.isfinite(arr)
        if overflowed.any():
            first = arr[overflowed].flat[0]
            raise ValueError(f"holds {first}, which rounds to {'-' if first < 0 else ''}inf as {target} "
                             f"(its largest is {float(np.finfo(target).max):.8g}): convert it first")
    return cast
