"""acl.media for the CPU runtime: DVPP's memory, channels, picture descriptors, JPEGD and VPC resize.

Same names, argument kinds ("k" pointers and handles, "I" sizes, "i" formats) and returns as
pyACL's media wrappers (CANN's python/pyACL/media): dvpp_malloc -> (ptr, ret),
dvpp_jpeg_get_image_info -> (width, height, components, ret), dvpp_jpeg_predict_dec_size ->
(size, ret), create_* -> a handle (0 on failure), the rest -> ret. Only what aclserve's DVPP
decoder (images/dvpp.py) uses is here, and only NV12 (PIXEL_FORMAT_YUV_SEMIPLANAR_420).

What is refused, as CANN's JPEGD/VPC constraints state it:
- by dvpp_jpeg_get_image_info: a JPEG JPEGD does not decode (below), with ACL_ERROR_UNSUPPORTED_JPEG;
- at the call (its return code; ACL_ERROR_INVALID_PARAM unless said): no current context, an
  unknown or uncreated channel, descriptor or resize config, a stream of another context
  (107003), input or output not in DVPP memory (dvpp_malloc's, of the context's device), a pixel
  format other than NV12 (ACL_ERROR_API_NOT_SUPPORT: the device takes others, this emulation
  does not), a JPEGD output stride set but not aligned (width: 128, or 64 on the 310P, 310B, A2, A3;
  height: 16), a VPC picture (input or output) with an odd side or strides not aligned (16 / 2), below its sides or its
  buffer under stride_w * stride_h * 3/2, sizes outside VPC's (input 10x6..8192x8192, output
  10x6..4096x4096, or 4096x8192 on the 310B, A2 and A3, even), a scale outside 1/32..16 each way;
- when the task runs (the stream's error at synchronize, ACL_ERROR_RT_INTERNAL_ERROR: the code
  the chip gives is not documented; and JPEGD's output descriptor's ret_code 1): its input or
  output no longer DVPP memory (freed since the call: never touched; a free while the task runs
  unmaps it once the task is done, _memory.use), no JPEG, a
  progressive, arithmetic-coded or lossless one, not YUV (CMYK, RGB), sampled otherwise than
  4:4:4, 4:2:2, 4:2:0, 4:0:0 or 4:4:0 (4:1:1), sides outside JPEGD's 32..8192, an output buffer
  under the decoded picture's stride_w * stride_h * 3/2;
- by dvpp_destroy_channel_desc: a desc whose channel is not destroyed, with
  ACL_ERROR_RELATIVE_RESOURCE_NOT_CLEARED (CANN 8.x's aclError table); the desc stays.
JPEGD sets the output descriptor's width, height (rounded down to even) and strides itself.
The pixel work is _dvpp.py's, the chip's limits by SoC _dvpp_limits.py's. Fault injection: faults kind "dvpp"
(each task, when it runs).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from .. import constants as C
from . import _dvpp, _memory, _state, faults
from ._args import INT, PTR, U32, api
from ._dvpp_limits import (JPEGD_HEIGHT_ALIGN, JPEGD_SIDES, PIXEL_FORMAT_YUV_SEMIPLANAR_420, VPC_HEIGHT_ALIGN,
                           VPC_INPUT, VPC_MIN_WIDTH_STRIDE, VPC_SCALE, VPC_WIDTH_ALIGN, jpegd_width_align, vpc_output)

log = logging.getLogger("aclserve.acl.cpu")

_OK, _BAD = C.ACL_SUCCESS, C.ACL_ERROR_INVALID_PARAM
_TASK_FAILED = C.ACL_ERROR_RT_INTERNAL_ERROR


@dataclass
class PicDesc:
    data: int = 0
    size: int = 0
    format: int = 0
    width: int = 0
    height: int = 0
    width_stride: int = 0
    height_stride: int = 0
    ret_code: int = 0


_lock = threading.Lock()
_buffers: dict[int, int] = {}  # dvpp_malloc's addresses -> their device
_channels: dict[int, int | None] = {}  # channel desc -> the device of its channel (None: not created)
_pics: dict[int, PicDesc] = {}
_resize_configs: set[int] = set()


def _reset(in_forked_child: bool = False) -> None:
    global _lock
    if in_forked_child:  # a parent's thread may have held the lock at the fork (_state.forget_in_child)
        _lock = threading.Lock()
    with _lock:
        _buffers.clear()
        _channels.clear()
        _pics.clear()
        _resize_configs.clear()


_state.on_finalize(_reset)
_state.on_fork_child(lambda: _reset(in_forked_child=True))  # the parent's DVPP objects are not the child's


def stats() -> dict:
    """Live DVPP objects (CPU runtime only): buffers, channel descs, channels, pic descs, resize configs."""
    with _lock:
        return {"buffers": len(_buffers), "channel_descs": len(_channels),
                "channels": sum(1 for d in _channels.values() if d is not None),
                "pic_descs": len(_pics), "resize_configs": len(_resize_configs)}


def _in_dvpp(ptr: int, length: int, device: int) -> bool:
    alloc = _memory.find(ptr, length) if ptr else None
    return alloc is not None and _buffers.get(alloc.ptr) == device


def _use_dvpp(spans, device: int):
    """The DVPP allocations of `device` holding each (ptr, length) span, held (_memory.use) until
    the Held is released; None when one is not (any more) such memory."""
    held = _memory.use(device, spans)
    if held is not None and any(_buffers.get(a.ptr) != device for a in held):
        held.release()
        held = None
    return held


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def _jpegd_output(frame, width_align: int) -> tuple[int, int, int, int]:
    """(width, height, width stride, height stride) of the NV12 picture JPEGD makes of `frame`:
    its sides rounded down to even, its strides aligned (what predict_dec_size sizes, and the
    decode writes)."""
    w, h = frame.width // 2 * 2, frame.height // 2 * 2
    return w, h, _align(w, width_align), _align(h, JPEGD_HEIGHT_ALIGN)


# -- memory -----------------------------------------------------------------------------------
@api("acl.media.dvpp_malloc", PTR)
def dvpp_malloc(size):
    ctx, ret = _state.current()
    if ret:
        return 0, ret
    ptr, ret = _memory.malloc(ctx.device, size, C.ACL_MEM_MALLOC_NORMAL_ONLY)
    if ret == _OK:
        with _lock:
            _buffers[ptr] = ctx.device
    return ptr, ret


@api("acl.media.dvpp_free", PTR)
def dvpp_free(dev_ptr):
    ctx, ret = _state.current()
    if ret:
        return ret
    with _lock:
        device = _buffers.pop(dev_ptr, None)
    return _BAD if device is None else _memory.free(dev_ptr)


# -- channels ---------------------------------------------------------------------------------
@api("acl.media.dvpp_create_channel_desc")
def dvpp_create_channel_desc():
    handle = _state.new_handle()
    with _lock:
        _channels[handle] = None
    return handle


@api("acl.media.dvpp_destroy_channel_desc", PTR)
def dvpp_destroy_channel_desc(channel_desc):
    with _lock:
        if _channels.get(channel_desc) is not None:
            # its channel is open: refused, the desc kept (CANN 8.x's aclError table; earlier releases unchecked)
            return C.ACL_ERROR_RELATIVE_RESOURCE_NOT_CLEARED
        return _OK if _channels.pop(channel_desc, False) is not False else _BAD


@api("acl.media.dvpp_create_channel", PTR)
def dvpp_create_channel(channel_desc):
    ctx, ret = _state.current()
    if ret:
        return ret
    with _lock:
        if channel_desc not in _channels or _channels[channel_desc] is not None:
            return _BAD
        _channels[channel_desc] = ctx.device
    return _OK


@api("acl.media.dvpp_destroy_channel", PTR)
def dvpp_destroy_channel(channel_desc):
    ctx, ret = _state.current()
    if ret:
        return ret
    with _lock:
        if _channels.get(channel_desc) is None:
            return _BAD
        _channels[channel_desc] = None
    return _OK


# -- picture descriptors and resize configs ---------------------------------------------------
@api("acl.media.dvpp_create_pic_desc")
def dvpp_create_pic_desc():
    handle = _state.new_handle()
    with _lock:
        _pics[handle] = PicDesc()
    return handle


@api("acl.media.dvpp_destroy_pic_desc", PTR)
def dvpp_destroy_pic_desc(pic_desc):
    with _lock:
        return _OK if _pics.pop(pic_desc, None) is not None else _BAD


def _accessors(field: str, kind: str):
    @api(f"acl.media.dvpp_set_pic_desc_{field}", PTR, kind)
    def setter(pic_desc, value):
        pic = _pics.get(pic_desc)
        if pic is None:
            return _BAD
        setattr(pic, field, value)
        return _OK

    @api(f"acl.media.dvpp_get_pic_desc_{field}", PTR)
    def getter(pic_desc):
        pic = _pics.get(pic_desc)
        return getattr(pic, field) if pic is not None else 0

    setter.__name__, getter.__name__ = f"dvpp_set_pic_desc_{field}", f"dvpp_get_pic_desc_{field}"
    return setter, getter


dvpp_set_pic_desc_data, dvpp_get_pic_desc_data = _accessors("data", PTR)
dvpp_set_pic_desc_size, dvpp_get_pic_desc_size = _accessors("size", U32)
dvpp_set_pic_desc_format, dvpp_get_pic_desc_format = _accessors("format", INT)
dvpp_set_pic_desc_width, dvpp_get_pic_desc_width = _accessors("width", U32)
dvpp_set_pic_desc_height, dvpp_get_pic_desc_height = _accessors("height", U32)
dvpp_set_pic_desc_width_stride, dvpp_get_pic_desc_width_stride = _accessors("width_stride", U32)
dvpp_set_pic_desc_height_stride, dvpp_get_pic_desc_height_stride = _accessors("height_stride", U32)
dvpp_set_pic_desc_ret_code, dvpp_get_pic_desc_ret_code = _accessors("ret_code", U32)


@api("acl.media.dvpp_create_resize_config")
def dvpp_create_resize_config():
    handle = _state.new_handle()
    with _lock:
        _resize_configs.add(handle)
    return handle


@api("acl.media.dvpp_destroy_resize_config", PTR)
def dvpp_destroy_resize_config(resize_config):
    with _lock:
        if resize_config not in _resize_configs:
            return _BAD
        _resize_configs.discard(resize_config)
    return _OK


# -- JPEGD ------------------------------------------------------------------------------------
def _read_frame(data: int, size: int):
    """(frame, ret) of the JPEG at host or device address `data` (read in place)."""
    if data == 0 or size == 0:
        return None, _BAD
    try:
        return _dvpp.read_frame(_dvpp.bytes_at(data, size)), _OK
    except _dvpp.Refused:
        return None, C.ACL_ERROR_FAILURE


@api("acl.media.dvpp_jpeg_get_image_info", PTR, U32)
def dvpp_jpeg_get_image_info(data, size):
    frame, ret = _read_frame(data, size)
    why = _dvpp.refusal(frame) if frame else None
    if why:  # CANN's page: it checks the stream is one JPEGD decodes (predict_dec_size's says nothing of it)
        log.info("dvpp_jpeg_get_image_info: %s", why)
        frame, ret = None, C.ACL_ERROR_UNSUPPORTED_JPEG
    return (frame.width, frame.height, frame.components, _OK) if frame else (0, 0, 0, ret)


@api("acl.media.dvpp_jpeg_predict_dec_size", PTR, U32, INT)
def dvpp_jpeg_predict_dec_size(data, data_size, output_pixel_format):
    frame, ret = _read_frame(data, data_size)
    if frame is None:
        return 0, ret
    if output_pixel_format != PIXEL_FORMAT_YUV_SEMIPLANAR_420:
        return 0, C.ACL_ERROR_API_NOT_SUPPORT
    _, _, sw, sh = _jpegd_output(frame, jpegd_width_align(_state.soc_name))
    return _dvpp.nv12_bytes(sw, sh), _OK


def _enqueue_on(channel_desc: int, stream: int):
    """(context, stream, ret) for a task on `channel_desc`'s channel and `stream`."""
    ctx, ret = _state.current()
    if ret:
        return None, None, ret
    if _channels.get(channel_desc) != ctx.device:
        return ctx, None, _BAD
    s, ret = _state.stream_of(stream, ctx)
    return ctx, s, ret


@api("acl.media.dvpp_jpeg_decode_async", PTR, PTR, U32, PTR, PTR)
def dvpp_jpeg_decode_async(channel_desc, data, size, output_desc, stream):
    ctx, s, ret = _enqueue_on(channel_desc, stream)
    if ret:
        return ret
    pic = _pics.get(output_desc)
    if pic is None or size == 0 or not _in_dvpp(data, size, ctx.device):
        return _BAD
    if pic.format != PIXEL_FORMAT_YUV_SEMIPLANAR_420:
        return C.ACL_ERROR_API_NOT_SUPPORT
    wa = jpegd_width_align(_state.soc_name)
    if pic.width_stride % wa or pic.height_stride % JPEGD_HEIGHT_ALIGN or not _in_dvpp(pic.data, pic.size, ctx.device):
        return _BAD
    out, out_size = pic.data, pic.size  # as given now (a later set_* is not this task's), as VPC's
    return s.enqueue(lambda: _jpegd(data, size, pic, out, out_size, wa, ctx.device))


def _jpegd(data: int, size: int, pic: PicDesc, out: int, out_size: int, wa: int, device: int) -> int:
    """The JPEGD task, on the stream's worker: decodes to `out` (the descriptor's buffer when the
    call was made) and sets the descriptor's sides, strides and ret_code."""
    held = _use_dvpp([(data, size), (out, out_size)], device)
    code = faults.trigger("dvpp", -1) if held else 0
    try:
        if held is None:
            raise _dvpp.Refused("its input or output is no longer DVPP memory (freed since the call)")
        if code:
            raise _dvpp.Refused(f"injected fault {code}")
        raw = _dvpp.bytes_at(data, size)  # (read in place, as the chip reads DVPP memory: no copy of the JPEG)
        frame = _dvpp.read_frame(raw)
        low, high = JPEGD_SIDES
        if not (low <= frame.width <= high and low <= frame.height <= high):
            raise _dvpp.Refused(f"{frame.width}x{frame.height} is outside JPEGD's {low}..{high} a side")
        w, h, sw, sh = _jpegd_output(frame, wa)
        need = _dvpp.nv12_bytes(sw, sh)
        if out_size < need:
            raise _dvpp.Refused(f"the output buffer holds {out_size} bytes, the {w}x{h} NV12 picture takes {need}")
        y, uv = _dvpp.decode_nv12(raw, frame)
        _dvpp.write_nv12(out, sw, sh, y, uv)
    except _dvpp.Refused as e:
        log.info("JPEGD task failed: %s", e)
        pic.ret_code = 1
        return code or _TASK_FAILED
    finally:
        if held is not None:
            held.release()
    pic.width, pic.height, pic.width_stride, pic.height_stride, pic.ret_code = w, h, sw, sh, 0
    return _OK


# -- VPC --------------------------------------------------------------------------------------
def _vpc_pic_ret(pic: PicDesc, sides, device: int) -> int:
    if pic.format != PIXEL_FORMAT_YUV_SEMIPLANAR_420:
        return C.ACL_ERROR_API_NOT_SUPPORT
    (wlow, whigh), (hlow, hhigh) = sides
    if not (wlow <= pic.width <= whigh and hlow <= pic.height <= hhigh):
        return _BAD
    if pic.width % 2 or pic.height % 2:  # YUV420SP in and out: even sides (VPC's format constraints)
        return _BAD
    if (pic.width_stride % VPC_WIDTH_ALIGN or pic.height_stride % VPC_HEIGHT_ALIGN
            or pic.width_stride < max(pic.width, VPC_MIN_WIDTH_STRIDE) or pic.height_stride < pic.height):
        return _BAD
    need = _dvpp.nv12_bytes(pic.width_stride, pic.height_stride)
    return _OK if pic.size >= need and _in_dvpp(pic.data, need, device) else _BAD


@api("acl.media.dvpp_vpc_resize_async", PTR, PTR, PTR, PTR, PTR)
def dvpp_vpc_resize_async(channel_desc, input_desc, output_desc, resize_config, stream):
    ctx, s, ret = _enqueue_on(channel_desc, stream)
    if ret:
        return ret
    src, dst = _pics.get(input_desc), _pics.get(output_desc)
    if src is None or dst is None or resize_config not in _resize_configs:
        return _BAD
    ret = _vpc_pic_ret(src, VPC_INPUT, ctx.device) or _vpc_pic_ret(dst, vpc_output(_state.soc_name), ctx.device)
    if ret:
        return ret
    least, most = VPC_SCALE
    if not (least <= dst.width / src.width <= most and least <= dst.height / src.height <= most):
        return _BAD
    src, dst = PicDesc(**vars(src)), PicDesc(**vars(dst))  # as given now (a later set_* is not this task's)
    return s.enqueue(lambda: _vpc(src, dst, ctx.device))


def _vpc(src: PicDesc, dst: PicDesc, device: int) -> int:
    """The VPC resize task, on the stream's worker."""
    held = _use_dvpp([(p.data, _dvpp.nv12_bytes(p.width_stride, p.height_stride)) for p in (src, dst)], device)
    if held is None:
        log.info("VPC task failed: its input or output is no longer DVPP memory (freed since the call)")
        return _TASK_FAILED
    with held:
        code = faults.trigger("dvpp", -1)
        if code:
            log.info("VPC task failed: injected fault %d", code)
            return code
        y, uv = _dvpp.read_nv12(src.data, src.width, src.height, src.width_stride, src.height_stride)
        y, uv = _dvpp.resize_nv12(y, uv, dst.width, dst.height)
        _dvpp.write_nv12(dst.data, dst.width_stride, dst.height_stride, y, uv)
    return _OK
