"""`acl.data_type_size`: the bytes of an element of each aclDataType, as CANN's aclDataTypeSize
gives them (hicann/runtime src/acl/aclrt_impl/data_buffer.cpp, aclDataTypeSizeImpl).

CANN's switch answers a type numpy has no dtype for too (BF16 2, COMPLEX64 8, COMPLEX128 16),
where this runtime said 0 for every type aclserve does not serve. Its sub-byte types take a whole
byte (INT4, UINT1, HIFLOAT4), and the fp6 and fp4 types of 38-41, which it does not list, fall to
its default, 8. A code aclDataType does not name is 0 here, where CANN's default says 8 of it too:
a size for no type at all is no answer a caller could use.
"""
from __future__ import annotations

from ... import dtypes as D

_SIZES = {
    D.ACL_DT_UNDEFINED: 0, D.ACL_STRING: 0,
    D.ACL_INT4: 1, D.ACL_UINT1: 1, D.ACL_HIFLOAT4: 1,
    D.ACL_BOOL: 1, D.ACL_INT8: 1, D.ACL_UINT8: 1,
    D.ACL_HIFLOAT8: 1, D.ACL_FLOAT8_E5M2: 1, D.ACL_FLOAT8_E4M3FN: 1, D.ACL_FLOAT8_E8M0: 1,
    D.ACL_FLOAT16: 2, D.ACL_INT16: 2, D.ACL_UINT16: 2, D.ACL_BF16: 2,
    D.ACL_FLOAT: 4, D.ACL_INT32: 4, D.ACL_UINT32: 4, D.ACL_COMPLEX32: 4,
    D.ACL_INT64: 8, D.ACL_UINT64: 8, D.ACL_DOUBLE: 8, D.ACL_COMPLEX64: 8,
    D.ACL_COMPLEX128: 16,
}
CANN_DEFAULT_SIZE = 8  # what CANN's switch gives a code it does not list


def element_size(data_type: int) -> int:
    """The bytes CANN gives for `data_type`; 0 for a code aclDataType does not name."""
    if data_type not in D.ACL_TYPE_NAMES:
        return 0
    return _SIZES.get(data_type, CANN_DEFAULT_SIZE)
