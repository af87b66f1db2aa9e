"""pyACL enums and error codes (the `acl` module exports none).

Values follow CANN 8.x `acl_base.h` / `acl_rt.h` / `rt_error_codes.h` / `ge_error_codes.h`
(CANN's pyACL API reference lists the same names). The data types (aclDataType) are defined
with their numpy and KServe names in aclserve/dtypes.py and re-exported here with the rest of
pyACL's enums; the dynamic-batch input name is the OM format's (om/container.py).
"""
from __future__ import annotations

from ..dtypes import (ACL_BOOL, ACL_DOUBLE, ACL_DT_UNDEFINED, ACL_FLOAT,  # noqa: F401  (pyACL's aclDataType)
                      ACL_FLOAT16, ACL_INT8, ACL_INT16, ACL_INT32, ACL_INT64, ACL_UINT8, ACL_UINT16,
                      ACL_UINT32, ACL_UINT64)
from ..om.container import DYNAMIC_BATCH_INPUT

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
ACL_ERROR_RELATIVE_RESOURCE_NOT_CLEARED = 148051  # dvpp_destroy_channel_desc with its channel open
ACL_ERROR_UNSUPPORTED_JPEG = 148052  # dvpp_jpeg_get_image_info: a JPEG JPEGD does not decode
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
ACL_ERROR_RT_STREAM_ABORT = 107023  # a stream's tasks were dropped by stream_abort
ACL_ERROR_RT_FEATURE_NOT_SUPPORT = 207000
ACL_ERROR_RT_MEMORY_ALLOCATION = 207001
ACL_ERROR_RT_NO_DEVICE = 207004
ACL_ERROR_RT_NO_EVENT_RESOURCE = 207007
ACL_ERROR_RT_NO_STREAM_RESOURCE = 207008
ACL_ERROR_RT_DEVICE_OOM = 207018
ACL_ERROR_RT_INTERNAL_ERROR = 507000
ACL_ERROR_RT_MODEL_EXECUTE = 507011
ACL_ERROR_RT_AICORE_EXCEPTION = 507015
ACL_ERROR_RT_REPORT_TIMEOUT = 507012
ACL_ERROR_RT_STREAM_SYNC_TIMEOUT = 507046
ACL_ERROR_RT_EVENT_SYNC_TIMEOUT = 507047
# what a device fails with as a whole (hicann/runtime ContextManage::SetGlobalFailureErr): every task
# of every context on it, until the device is reset (runtime/device_health.py)
ACL_ERROR_RT_DEVICE_MEM_ERROR = 507053
ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR = 507054
ACL_ERROR_RT_DEVICE_TASK_ABORT = 107022  # (aclrtDeviceTaskAbort's: every context of the device too)
# The codes a device failed as a whole reports (a sustained page fault is 507015, as an ordinary AI
# Core exception of one stream is): a probe's copy failing with another code is not taken as one
WHOLE_DEVICE_FAILURES = frozenset({ACL_ERROR_RT_AICORE_EXCEPTION, ACL_ERROR_RT_DEVICE_MEM_ERROR,
                                   ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR, ACL_ERROR_RT_DEVICE_TASK_ABORT})

ACL_ERROR_GE_PARAM_INVALID = 145000
ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID = 145002
ACL_ERROR_GE_EXEC_MODEL_ID_INVALID = 145003
ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID = 145006
ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID = 145011
ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID = 145012
ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID = 145013
ACL_ERROR_GE_AIPP_NOT_EXIST = 145015  # get_first_aipp_info on an input without static AIPP
ACL_ERROR_NOT_STATIC_AIPP = 100038  # what older CANN returns for it (deprecated for 145015)
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
    ACL_ERROR_RELATIVE_RESOURCE_NOT_CLEARED: "a resource that depends on it is not destroyed (a DVPP channel)",
    ACL_ERROR_UNSUPPORTED_JPEG: "JPEG coding JPEGD does not decode (progressive, arithmetic, not YUV, 4:1:1)",
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
    ACL_ERROR_RT_STREAM_ABORT: "the stream's tasks were dropped (stream_abort)",
    ACL_ERROR_RT_FEATURE_NOT_SUPPORT: "feature not supported",
    ACL_ERROR_RT_MEMORY_ALLOCATION: "device memory allocation failed",
    ACL_ERROR_RT_NO_DEVICE: "no device",
    ACL_ERROR_RT_NO_EVENT_RESOURCE: "no event resources left",
    ACL_ERROR_RT_NO_STREAM_RESOURCE: "no stream resources left",
    ACL_ERROR_RT_DEVICE_OOM: "device out of memory",
    ACL_ERROR_RT_INTERNAL_ERROR: "runtime internal error",
    ACL_ERROR_RT_MODEL_EXECUTE: "model execution failed on the device",
    ACL_ERROR_RT_AICORE_EXCEPTION: "AI Core exception",
    ACL_ERROR_RT_DEVICE_MEM_ERROR: "device memory error",
    ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR: "HBM multi-bit ECC error",
    ACL_ERROR_RT_DEVICE_TASK_ABORT: "the device's tasks were aborted (device task abort)",
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
    ACL_ERROR_GE_AIPP_NOT_EXIST: "no static AIPP on that input",
    ACL_ERROR_NOT_STATIC_AIPP: "no static AIPP on that input",
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

# aclrtSetStreamFailureMode's modes (pyACL: acl.rt.set_stream_failure_mode); CONTINUE is the default
ACL_CONTINUE_ON_FAILURE = 0
ACL_STOP_ON_FAILURE = 1

# aclrtCreateEventWithFlag / aclrtCreateEventExWithFlag flags
ACL_EVENT_SYNC = 0x1  # may be waited on by another stream (aclrtStreamWaitEvent)
ACL_EVENT_CAPTURE_STREAM_PROGRESS = 0x2
ACL_EVENT_TIME_LINE = 0x8  # records timestamps (aclrtEventElapsedTime)
ACL_EVENT_DEVICE_USE_ONLY = 0x10
ACL_EVENT_EXTERNAL = 0x20
ACL_EVENT_IPC = 0x40

# query_event_status (aclrtEventRecordedStatus); the deprecated query_event is the opposite.
ACL_EVENT_RECORDED_STATUS_NOT_READY = 0
ACL_EVENT_RECORDED_STATUS_COMPLETE = 1

ACL_CALLBACK_NO_BLOCK = 0
ACL_CALLBACK_BLOCK = 1

ACL_DYNAMIC_TENSOR_NAME = DYNAMIC_BATCH_INPUT
# aclAippInputFormat (get_first_aipp_info's inputFormat); aclserve compiles RGB888_U8 and YUV400_U8
ACL_RGB888_U8 = 3
ACL_YUV400_U8 = 4
AIPP_FORMAT_NAMES = {1: "YUV420SP_U8", 2: "XRGB8888_U8", 3: "RGB888_U8", 4: "YUV400_U8", 7: "ARGB8888_U8",
                     8: "YUYV_U8", 9: "YUV422SP_U8", 10: "AYUV444_U8", 11: "RAW10", 12: "RAW12", 13: "RAW16",
                     14: "RAW24"}
ACL_DYNAMIC_AIPP_NAME = "ascend_dynamic_aipp_data"  # the input an OM of dynamic AIPP takes its parameters in

# -- formats -----------------------------------------------------------------------------------
ACL_FORMAT_UNDEFINED = -1
ACL_FORMAT_NCHW = 0
ACL_FORMAT_NHWC = 1
ACL_FORMAT_ND = 2

FORMAT_NAMES = {ACL_FORMAT_UNDEFINED: "UNDEFINED", ACL_FORMAT_NCHW: "NCHW",
                ACL_FORMAT_NHWC: "NHWC", ACL_FORMAT_ND: "ND"}
