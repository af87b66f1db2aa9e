"""The CPU runtime: a pyACL-compatible `acl` module that executes models with ONNX Runtime.

    from aclserve.acl import cpu as acl
    acl.init(); acl.rt.set_device(0); ...

Same names, argument order, return tuples and error codes as CANN's pyACL (8.x) for the subset
aclserve uses (CANN's pyACL API reference). Device memory is real process memory; streams are
worker threads; models are CPU OM containers run by ONNX Runtime; real ATC OMs are refused. `acl.media` emulates
DVPP's JPEG decode (JPEGD) and resize (VPC) to NV12 with Pillow (media.py).

Extras that pyACL does not have (CPU runtime only):
    memory_stats(device=0) -> dict   used/total/free, huge_advised_bytes, huge_backed_bytes, ...
    media_stats() -> dict            live DVPP buffers, channels, picture descs, resize configs
    device_limits() -> (streams, events)  per-device limits it enforces (like a 310P by default)
    set_threads(n)                   ORT intra-op threads for models loaded afterwards
    faults                           fault injection for tests (see faults.py)
    SOC_NAME                         what get_soc_name() returns by default
Environment: ACLSERVE_CPU_DEVICES, ACLSERVE_CPU_DEVICE_MEMORY, ACLSERVE_CPU_THREADS,
ACLSERVE_CPU_SOC, ACLSERVE_CPU_LACKS, ACLSERVE_CPU_FAULTS, ACLSERVE_CPU_CHECK_HOST (see settings.py and
faults.py).
"""
from __future__ import annotations

import json
import logging

from .. import constants as C
from . import _dataset, _err_msg, _memory, _state, faults, mdl, media, rt, settings, util
from ._type_sizes import element_size
from ._args import INT, PTR, STR, api

log = logging.getLogger("aclserve.acl.cpu")

SOC_NAME = settings.DEFAULT_SOC
VERSION = (8, 0, 0)  # the CANN pyACL release whose behaviour this runtime follows

__all__ = ["init", "finalize", "get_version", "get_soc_name", "get_recent_err_msg", "create_data_buffer",
           "get_data_buffer_addr", "get_data_buffer_size", "get_data_buffer_size_v2",
           "update_data_buffer", "destroy_data_buffer", "data_type_size", "rt", "mdl", "media", "util",
           "faults", "memory_stats", "media_stats", "device_limits", "set_threads", "SOC_NAME"]


@api("acl.init", STR, optional=1)
def init(config_path=""):
    """Initialise the runtime; the optional acl.json must exist and be JSON (its keys are ignored)."""
    if config_path:
        try:
            with open(config_path) as f:
                text = f.read()
        except OSError:
            return C.ACL_ERROR_INVALID_FILE
        try:
            if text.strip():
                json.loads(text)
        except ValueError:
            return C.ACL_ERROR_PARSE_FILE
    lacking = settings.lacks()  # read first: a bad value leaves the runtime uninitialised
    ret = _state.init()
    if ret == C.ACL_SUCCESS:
        _present_calls(lacking)
    return ret


_left_out: dict[str, object] = {}  # "rt.create_event_ex_with_flag" -> the function, while left out


def _present_calls(lacking: frozenset[str]) -> None:
    """Leave out the optional calls ACLSERVE_CPU_LACKS names (the module then has no such
    attribute, as an older pyACL has not), and put back those it no longer names."""
    import sys
    for call in settings.OPTIONAL_CALLS:
        owner_name, _, attr = call.rpartition(".")
        owner = getattr(sys.modules[__name__], owner_name) if owner_name else sys.modules[__name__]
        if call in lacking and call not in _left_out:
            _left_out[call] = getattr(owner, attr)
            delattr(owner, attr)
        elif call not in lacking and call in _left_out:
            setattr(owner, attr, _left_out.pop(call))


@api("acl.finalize")
def finalize():
    return _state.finalize()


@api("acl.get_version")
def get_version():
    return (*VERSION, C.ACL_SUCCESS)


@api("acl.get_soc_name")
def get_soc_name():
    return _state.soc_name


@api("acl.get_recent_err_msg")
def get_recent_err_msg():
    """What the calls that failed in this thread said of it since the last call, the newest first
    (a str), or None; cleared. A run ONNX Runtime failed says why (_err_msg.py)."""
    return _err_msg.take()


@api("acl.create_data_buffer", PTR, PTR)
def create_data_buffer(data, size):
    return _dataset.create_data_buffer(data, size)


@api("acl.get_data_buffer_addr", PTR)
def get_data_buffer_addr(data_buffer):
    buf = _dataset.buffers.get(data_buffer)
    return buf.addr if buf else 0


@api("acl.get_data_buffer_size_v2", PTR)
def get_data_buffer_size_v2(data_buffer):
    buf = _dataset.buffers.get(data_buffer)
    return buf.size if buf else 0


@api("acl.get_data_buffer_size", PTR)
def get_data_buffer_size(data_buffer):
    buf = _dataset.buffers.get(data_buffer)
    return buf.size & 0xFFFFFFFF if buf else 0


@api("acl.update_data_buffer", PTR, PTR, PTR)
def update_data_buffer(data_buffer, data, size):
    return _dataset.update_data_buffer(data_buffer, data, size)


@api("acl.destroy_data_buffer", PTR)
def destroy_data_buffer(data_buffer):
    return _dataset.destroy_data_buffer(data_buffer)


@api("acl.data_type_size", INT)
def data_type_size(data_type):
    """Bytes an element of `data_type` takes, as CANN's aclDataTypeSize gives them (_type_sizes.py)."""
    return element_size(data_type)


def memory_stats(device: int = 0) -> dict:
    """Device memory figures of the CPU runtime (raises ValueError before init / bad device)."""
    return _memory.stats(device)


def media_stats() -> dict:
    """Live DVPP objects of acl.media: buffers, channel descs, channels, pic descs, resize configs."""
    return media.stats()


def device_limits() -> tuple[int, int]:
    """(streams, events) each device allows: ACLSERVE_CPU_MAX_STREAMS / ACLSERVE_CPU_MAX_EVENTS, by
    default those CANN documents for the SoC it presents (settings.default_limits)."""
    return settings.max_streams(), settings.max_events()


def set_threads(n: int | None) -> None:
    """ONNX Runtime intra-op threads for models loaded from now on (None = ACLSERVE_CPU_THREADS)."""
    settings.set_threads(n)

