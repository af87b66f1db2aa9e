"""acl.data_type_size against CANN's aclDataTypeSize (hicann/runtime src/acl/aclrt_impl/
data_buffer.cpp): the CPU runtime said 0 for BF16, COMPLEX64 and COMPLEX128, every type numpy
has no dtype for, where CANN gives their sizes (a datatype tester)."""
from __future__ import annotations

import numpy as np

# aclDataType code: bytes, as CANN's switch gives them; written out here, not read from aclserve
CANN_SIZES = {
    -1: 0, 13: 0,  # DT_UNDEFINED, STRING
    0: 4, 1: 2, 2: 1, 3: 4, 4: 1, 6: 2, 7: 2, 8: 4, 9: 8, 10: 8, 11: 8, 12: 1,
    16: 8, 17: 16, 27: 2,  # COMPLEX64, COMPLEX128, BF16
    29: 1, 30: 1,  # INT4, UINT1: a whole byte
    33: 4, 34: 1, 35: 1, 36: 1, 37: 1,  # COMPLEX32, HIFLOAT8, FLOAT8_E5M2, _E4M3FN, _E8M0
    38: 8, 39: 8, 40: 8, 41: 8,  # FLOAT6_E3M2, _E2M3, FLOAT4_E2M1, _E1M2: not listed, CANN's default
    42: 1,  # HIFLOAT4
}


def test_every_acl_data_type_has_the_size_cann_gives(acl):
    assert {code: acl.data_type_size(code) for code in CANN_SIZES} == CANN_SIZES


def test_sizes_take_any_index_as_pyacl_parses_an_int(acl):
    assert acl.data_type_size(np.int32(27)) == 2


def test_a_code_acl_data_type_does_not_name_is_size_0_on_the_cpu_runtime(acl, cpu_only):
    """CANN's switch gives its default, 8, for any code; 0 says there is no such type."""
    assert [acl.data_type_size(code) for code in (5, 14, 28, 43, -2)] == [0] * 5
