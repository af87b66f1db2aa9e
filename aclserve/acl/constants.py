"""pyACL enums and error codes (the `acl` module exports none), and dtype <-> numpy.

Values follow CANN 8.x `acl_base.h` / `acl_rt.h` / `rt_error_codes.h` / `ge_error_codes.h`;
see shared reference/pyacl.md sections 1-6.
"""
from __future__ import annotations

import numpy as np

ACL_SUCCESS = 0

# -- error codes -------------------------------------------------------------------------------
ACL_ERROR_INVALID_PARAM = 100000
ACL_ERROR_UNINITIALIZE = 100001
ACL_ERROR_REPEAT_INITIALIZE = 100002
ACL_ERROR_INVALID_FILE = 100003
ACL_ERROR_PARSE_FILE = 100006
ACL_ERROR_INVALID_MODEL_ID = 100011
ACL_ERROR_INVALID_MODEL_INPUT = 100017  # reserved: not returned by the CPU runtime yet
ACL_ERROR_INVALID_MODEL_OUTPUT = 100018  # reserved: not returned by the CPU runtime yet
ACL_ERROR_MODEL_NOT_DYNAMIC = 100019
ACL_ERROR_REPEAT_FINALIZE = 100037
ACL_ERROR_BAD_ALLOC = 200000
ACL_ERROR_API_NOT_SUPPORT = 200001
ACL_ERROR_INVALID_RESOURCE_HANDLE = 200005
ACL_ERROR_INTERNAL_ERROR = 500000
ACL_ERROR_FAILURE = 500001
ACL_ERROR_GE_FAILURE = 500002

ACL_ERROR_RT_PARAM_INVALID = 107000
ACL_ERROR_RT_INVALID_DEVICEID = 107001
ACL_ERROR_RT_CONTEXT_NULL = 107002
ACL_ERROR_RT_STREAM_CONTEXT = 107003
ACL_ERROR_RT_MODEL_CONTEXT = 107004
ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID = 107006
ACL_ERROR_RT_EVENT_TIMESTAMP_REVERSAL = 107007
ACL_ERROR_RT_THREAD_SUBSCRIBE = 107012
ACL_ERROR_RT_FEATURE_NOT_SUPPORT = 207000
ACL_ERROR_RT_MEMORY_ALLOCATION = 207001
ACL_ERROR_RT_NO_DEVICE = 207004
ACL_ERROR_RT_NO_EVENT_RESOURCE = 207007
ACL_ERROR_RT_NO_STREAM_RESOURCE = 207008
ACL_ERROR_RT_DEVICE_OOM = 207018
ACL_ERROR_RT_INTERNAL_ERROR = 507000
ACL_ERROR_RT_MODEL_EXECUTE = 507011
ACL_ERROR_RT_REPORT_TIMEOUT = 507012
ACL_ERROR_RT_STREAM_SYNC_TIMEOUT = 507046
ACL_ERROR_RT_EVENT_SYNC_TIMEOUT = 507047

ACL_ERROR_GE_PARAM_INVALID = 145000
ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID = 145002
ACL_ERROR_GE_EXEC_MODEL_ID_INVALID = 145003
ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID = 145006
ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID = 145011
ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID = 145012
ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID = 145013
ACL_ERROR_GE_MEMORY_ALLOCATION = 245000

ERROR_MEANINGS: dict[int, str] = {
    ACL_ERROR_INVALID_PARAM: "invalid parameter",
    ACL_ERROR_UNINITIALIZE: "ACL not initialized (call acl.init first)",
    ACL_ERROR_REPEAT_INITIALIZE: "ACL already initialized",
    ACL_ERROR_INVALID_FILE: "invalid file",
    ACL_ERROR_PARSE_FILE: "file could not be parsed",
    ACL_ERROR_INVALID_MODEL_ID: "invalid model id",
    ACL_ERROR_INVALID_MODEL_INPUT: "model inputs do not match",
    ACL_ERROR_INVALID_MODEL_OUTPUT: "model outputs do not match",
    ACL_ERROR_MODEL_NOT_DYNAMIC: "model is not dynamic",
    ACL_ERROR_REPEAT_FINALIZE: "ACL already finalized",
    ACL_ERROR_BAD_ALLOC: "host memory allocation failed",
    ACL_ERROR_API_NOT_SUPPORT: "API not supported",
    ACL_ERROR_INVALID_RESOURCE_HANDLE: "invalid resource handle",
    ACL_ERROR_INTERNAL_ERROR: "internal error",
    ACL_ERROR_FAILURE: "failure",
    ACL_ERROR_GE_FAILURE: "graph engine failure",
    ACL_ERROR_RT_PARAM_INVALID: "runtime parameter invalid",
    ACL_ERROR_RT_INVALID_DEVICEID: "invalid device id",
    ACL_ERROR_RT_CONTEXT_NULL: "no current context in this thread (call acl.rt.set_context)",
    ACL_ERROR_RT_STREAM_CONTEXT: "stream not in current context",
    ACL_ERROR_RT_MODEL_CONTEXT: "model not in current context",
    ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID: "event has no timestamp yet (not completed)",
    ACL_ERROR_RT_EVENT_TIMESTAMP_REVERSAL: "event timestamps reversed (end before start)",
    ACL_ERROR_RT_THREAD_SUBSCRIBE: "thread is not subscribed to a stream's reports",
    ACL_ERROR_RT_FEATURE_NOT_SUPPORT: "feature not supported",
    ACL_ERROR_RT_MEMORY_ALLOCATION: "device memory allocation failed",
    ACL_ERROR_RT_NO_DEVICE: "no device",
    ACL_ERROR_RT_NO_EVENT_RESOURCE: "no event resources left",
    ACL_ERROR_RT_NO_STREAM_RESOURCE: "no stream resources left",
    ACL_ERROR_RT_DEVICE_OOM: "device out of memory",
    ACL_ERROR_RT_INTERNAL_ERROR: "runtime internal error",
    ACL_ERROR_RT_MODEL_EXECUTE: "model execution failed on the device",
    ACL_ERROR_RT_REPORT_TIMEOUT: "no report within the timeout",
    ACL_ERROR_RT_STREAM_SYNC_TIMEOUT: "stream synchronize timed out",
    ACL_ERROR_RT_EVENT_SYNC_TIMEOUT: "event synchronize timed out",
    ACL_ERROR_GE_PARAM_INVALID: "model parameter invalid (e.g. a buffer smaller than the tensor)",
    ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID: "model file missing or unreadable",
    ACL_ERROR_GE_EXEC_MODEL_ID_INVALID: "unknown model id",
    ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID: "not a loadable OM file (size, magic or length)",
    ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID: "dynamic-batch input buffer is null",
    ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID: "dynamic-batch input buffer too small",
    ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID: "batch size is not a compiled gear",
    ACL_ERROR_GE_MEMORY_ALLOCATION: "graph engine memory allocation failed",
}


def error_meaning(ret: int) -> str:
    return ERROR_MEANINGS.get(ret, "unknown ACL error")


# -- runtime enums -----------------------------------------------------------------------------
ACL_DEVICE = 0  # run mode: application on the board CPU
ACL_HOST = 1  # run mode: application on the host, device over PCIe

ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEM_MALLOC_HUGE_ONLY = 1
ACL_MEM_MALLOC_NORMAL_ONLY = 2
ACL_MEM_MALLOC_HUGE_FIRST_P2P = 3
ACL_MEM_MALLOC_HUGE_ONLY_P2P = 4
ACL_MEM_MALLOC_NORMAL_ONLY_P2P = 5
ACL_MEM_TYPE_LOW_BAND_WIDTH = 0x100
ACL_MEM_TYPE_HIGH_BAND_WIDTH = 0x1000

ACL_MEMCPY_HOST_TO_HOST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_MEMCPY_DEVICE_TO_DEVICE = 3
ACL_MEMCPY_DEFAULT = 4

ACL_DDR_MEM = 0
ACL_HBM_MEM = 1
ACL_DDR_MEM_HUGE = 2
ACL_DDR_MEM_NORMAL = 3
ACL_HBM_MEM_HUGE = 4
ACL_HBM_MEM_NORMAL = 5

# query_event_status (aclrtEventRecordedStatus); the deprecated query_event is the opposite.
ACL_EVENT_RECORDED_STATUS_NOT_READY = 0
ACL_EVENT_RECORDED_STATUS_COMPLETE = 1

ACL_CALLBACK_NO_BLOCK = 0
ACL_CALLBACK_BLOCK = 1

ACL_DYNAMIC_TENSOR_NAME = "ascend_mbatch_shape_data"

# -- data types and formats --------------------------------------------------------------------
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

ACL_FORMAT_UNDEFINED = -1
ACL_FORMAT_NCHW = 0
ACL_FORMAT_NHWC = 1
ACL_FORMAT_ND = 2

FORMAT_NAMES = {ACL_FORMAT_UNDEFINED: "UNDEFINED", ACL_FORMAT_NCHW: "NCHW",
                ACL_FORMAT_NHWC: "NHWC", ACL_FORMAT_ND: "ND"}

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

# KServe v2 datatype names, used by the OM header, the server and the CLI.
_ACL_TO_KSERVE = {
    ACL_FLOAT: "FP32", ACL_FLOAT16: "FP16", ACL_DOUBLE: "FP64",
    ACL_INT8: "INT8", ACL_INT16: "INT16", ACL_INT32: "INT32", ACL_INT64: "INT64",
    ACL_UINT8: "UINT8", ACL_UINT16: "UINT16", ACL_UINT32: "UINT32", ACL_UINT64: "UINT64",
    ACL_BOOL: "BOOL",
}
_KSERVE_TO_ACL = {v: k for k, v in _ACL_TO_KSERVE.items()}


def acl_to_numpy(acl_dtype: int) -> np.dtype:
    try:
        return _ACL_TO_NUMPY[acl_dtype]
    except KeyError:
        raise ValueError(f"ACL data type {acl_dtype} has no numpy equivalent") from None


def numpy_to_acl(dtype) -> int:
    try:
        return _NUMPY_TO_ACL[np.dtype(dtype)]
    except KeyError:
        raise ValueError(f"numpy dtype {np.dtype(dtype)} has no ACL equivalent") from None


def acl_to_kserve(acl_dtype: int) -> str:
    try:
        return _ACL_TO_KSERVE[acl_dtype]
    except KeyError:
        raise ValueError(f"ACL data type {acl_dtype} has no KServe datatype") from None


def kserve_to_acl(name: str) -> int:
    try:
        return _KSERVE_TO_ACL[name]
    except KeyError:
        raise ValueError(f"unknown datatype {name!r}") from None


def kserve_to_numpy(name: str) -> np.dtype:
    return acl_to_numpy(kserve_to_acl(name))


def numpy_to_kserve(dtype) -> str:
    return acl_to_kserve(numpy_to_acl(dtype))


KSERVE_DATATYPES = tuple(_KSERVE_TO_ACL)
