"""DvppDecoder: JPEG decode and resize on an Ascend chip's DVPP (pyACL `acl.media`), behind the
same call as the CPU decoder: `decoder(data, plan) -> uint8 [H, W, C]`.

Written from CANN's pyACL media API documentation (acl.media JPEGD and VPC, with their stride
constraints), checked against pyACL's own media wrappers (CANN's python/pyACL/media: argument
kinds and return tuples) and Ascend/samples' acllite_imageproc.py. It runs on the CPU runtime:
its acl.media (acl/cpu/media.py) emulates JPEGD and VPC to NV12 with Pillow and refuses what the
documentation says the chip refuses, so every call, return shape, buffer size, stride and
teardown here is exercised by the tests. STILL UNVERIFIED ON HARDWARE (no machine of this
project has an NPU): the chip's pixels (its chroma filter and its VPC scaler: the emulation's
are 2x2 averaging and bilinear), the error codes a failed JPEGD or VPC task gives at
synchronize, and whether a channel or buffer left by a hung task is reclaimed at exit.
Flow per image: probe and limit-check the header; copy the JPEG to DVPP memory from where it lies
(the one copy of it: a memoryview into the request body is not copied on the host); JPEGD decodes to
YUV420SP (NV12; width stride 128 on the Ascend310 and the training series' Ascend910s, 64 on the
Ascend310P, 310B and the A2 and A3, height stride 16: soc_families.py sorts the SoC); VPC resizes
to the plan's H x W (NV12, strides 16 / 2, the width's 32 at least);
the result is copied back and converted to RGB (JPEG's full-range BT.601) or grey (the Y plane)
on the host. What DVPP is not given, to the CPU decoder: other resize policies than stretch, other
interpolations than bilinear (VPC resizes with its default filter whatever a plan asks), PNG,
JPEGs other than baseline (JPEGD decodes no progressive or arithmetic-coded ones) or not coded
as YCbCr or grey (an RGB or CMYK JPEG: JPEGD reads YUV only) or sampled otherwise than 4:4:4,
4:2:2, 4:2:0, 4:4:0 or grey (a 4:1:1 one: JPEGD refuses it), JPEGs with an
EXIF orientation (JPEGD turns them itself, past the geometry given to it), sizes outside JPEGD's
32-8,192 pixels a side or VPC's scaling from 1/32 to 16 times, targets under VPC's smallest
output (10 x 6) or over its largest (4,096 x 4,096; x 8,192 on the 310B, A2 and A3), odd sizes (of the image or
the target), and any failure of DVPP (logged once). One channel and stream, used under this
object's own context by one thread at a time (a lock), and three DVPP buffers kept from one
image to the next (KeptBuffer: CANN advises against a malloc and free per image); a task that
does not finish within DVPP_WAIT_MS gives DVPP up for good (its buffers, channel and stream are left to the chip, which
may still write them) and every image after it decodes on the CPU. The wait is timed only where
the CANN has synchronize_stream_with_timeout (acl/compat.py); on an older one a hung task holds
the decoder, and every image request behind it, for good.
"""
from __future__ import annotations

import collections
import logging
import threading

import numpy as np

from ..acl import AclError, check, check_handle, release
from ..acl import constants as C
from ..acl.compat import soc_name, synchronize_stream
from ..acl.context import restoring_context, using_context
from ..soc_families import SocFamily, soc_family
from .header import ImageInfo, check_size, check_work, probe
from .plan import ImagePlan

log = logging.getLogger(__name__)

PIXEL_FORMAT_YUV_SEMIPLANAR_420 = 1  # acldvppPixelFormat NV12 (acl_dvpp.h)
JPEGD_HEIGHT_ALIGN = 16
JPEGD_SIDES = (32, 8192)  # JPEGD's input, pixels a side
# the subsamplings JPEGD decodes (CANN's JPEGD constraints: "444/422/420/400/440"; not 4:1:1, which
# acldvppJpegGetImageInfoV2 names, nor other sampling factors): header.py's names
JPEGD_SUBSAMPLINGS = ("4:4:4", "4:2:2", "4:2:0", "4:4:0", "4:0:0")
VPC_WIDTH_ALIGN, VPC_HEIGHT_ALIGN = 16, 2
# a VPC picture's width stride is at least this (CANN's acl.media VPC constraints: "宽Stride最小32"
# on the Atlas 200/300/500 inference products; himpi VPC the same on the 310P series)
VPC_MIN_WIDTH_STRIDE = 32
VPC_SCALE = (1 / 32, 16)  # VPC resizes by these factors at most, each way
VPC_OUTPUT = ((10, 4096), (6, 4096))  # VPC's output width and height ranges: vpc_output(soc)
VPC_LARGEST_OUTPUT = ((10, 4096), (6, 8192))  # ... on the Ascend310B, A2 and A3 (VPC_TALL_OUTPUT)
# the families whose JPEGD aligns a width stride to 64 (not the Ascend310's and training series' 128),
# and whose VPC outputs up to 8,192 rows (CANN's JPEGD and VPC constraints)
JPEGD_ALIGN_64 = (SocFamily.ATLAS_INFERENCE, SocFamily.ATLAS_200I_500_A2, SocFamily.ATLAS_A2, SocFamily.ATLAS_A3)
VPC_TALL_OUTPUT = (SocFamily.ATLAS_200I_500_A2, SocFamily.ATLAS_A2, SocFamily.ATLAS_A3)
DVPP_WAIT_MS = 5000  # a JPEGD or VPC task takes milliseconds: past this the chip is not waited for
# DVPP buffers are kept between images up to this size (a larger one is freed after its image:
# an 8,192 x 4,096 picture's NV12 is 48 MiB), grown in powers of two from KEPT_MIN_BYTES
KEPT_MAX_BYTES = 32 << 20
KEPT_MIN_BYTES = 64 << 10


def jpegd_width_align(soc: str | None) -> int:
    """JPEGD's output width stride is the width aligned to this (pyACL's JPEGD constraints): 128
    on the Ascend310 (Atlas 200/300/500) and the training series (Ascend910, 910A/B, 910ProA/B,
    910PremiumA); 64 on the Ascend310P (Atlas inference), 310B (200I/500 A2) and the Atlas A2
    (Ascend910B1..B4) and A3. An unknown SoC gets 128, as the first two."""
    return 64 if soc_family(soc) in JPEGD_ALIGN_64 else 128


def vpc_output(soc: str | None):
    """VPC's output (width range, height range) (CANN's VPC constraints): up to 4096 x 8192 on the
    Ascend310B and the A2 and A3; 4096 x 4096 on the Ascend310P, 310, training series (the Ascend910B
    among them) and an unknown SoC."""
    return VPC_LARGEST_OUTPUT if soc_family(soc) in VPC_TALL_OUTPUT else VPC_OUTPUT


def plan_refusals(plan: ImagePlan) -> list[str]:
    """Why DVPP never decodes a picture for this plan, whatever the picture and the SoC (empty:
    it may): in words for the log line at load (server/images.py)."""
    why = []
    if plan.resize != "stretch":  # (VPC resizes the whole picture to the target: no crop, no pad)
        why.append(f"its resize is {plan.resize}, and DVPP only stretches")
    if plan.interpolation != "bilinear":
        # VPC resizes with its default filter (acldvppSetResizeConfigInterpolation 0: bilinear on
        # the 310P and later, CANN's own high-order filter on the 310 and 910), whatever the plan
        # asks: the interpolation the model was trained with (nearest's single pixels, bicubic,
        # area) comes before DVPP's offload
        why.append(f"its interpolation is {plan.interpolation}, and VPC resizes with its own filter")
    if plan.width % 2 or plan.height % 2:  # NV12 halves both sides
        why.append(f"its size {plan.width}x{plan.height} has an odd side")
    (wlow, whigh), (hlow, hhigh) = VPC_LARGEST_OUTPUT
    if not (wlow <= plan.width <= whigh and hlow <= plan.height <= hhigh):
        why.append(f"its size {plan.width}x{plan.height} is outside VPC's output ({wlow}-{whigh:,} wide, "
                   f"{hlow}-{hhigh:,} high at most)")
    return why


def dvpp_takes(info: ImageInfo, plan: ImagePlan, output=VPC_OUTPUT) -> bool:
    """Whether DVPP decodes this image for this plan (else the CPU decoder does); `output`: the
    SoC's vpc_output."""
    if info.format != "JPEG" or not info.baseline or info.orientation != 1 or not info.ycc or plan_refusals(plan):
        return False
    if info.subsampling not in JPEGD_SUBSAMPLINGS:
        return False  # JPEGD refuses it (148052): the CPU decodes it, without a warning
    if info.width % 2 or info.height % 2:
        return False  # NV12 halves both sides (JPEGD rounds an odd one down on some SoCs: not followed)
    low, high = JPEGD_SIDES
    if not (low <= info.width <= high and low <= info.height <= high):
        return False
    (wlow, whigh), (hlow, hhigh) = output
    if not (wlow <= plan.width <= whigh and hlow <= plan.height <= hhigh):
        return False  # VPC refuses the call: the CPU decodes it, without a warning
    least, most = VPC_SCALE
    return least <= plan.width / info.width <= most and least <= plan.height / info.height <= most


# What became of an image given to DvppDecoder: decoded on DVPP, or on the CPU because DVPP does
# not take it (dvpp_takes), because DVPP failed on it, or because DVPP was given up (a hung task)
DECODED, NOT_TAKEN, FAILED, GIVEN_UP = "dvpp", "not_taken", "failed", "given_up"
OUTCOMES = (DECODED, NOT_TAKEN, FAILED, GIVEN_UP)


class DvppError(RuntimeError):
    """DVPP cannot be used (no acl.media, or opening the channel failed)."""


class DvppHung(DvppError):
    """A DVPP task did not finish within DVPP_WAIT_MS."""


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


class DvppDecoder:
    kind = "dvpp"

    def __init__(self, runtime, fallback, device_id: int = 0):
        """DVPP of device `device_id`. Raises DvppError whatever fails (the caller decodes on the
        CPU then), a device that does not exist included."""
        acl = runtime.acl
        self.device_id = device_id
        if not hasattr(acl, "media"):
            raise DvppError("this CANN's pyACL has no acl.media")
        self._acl, self._media, self._fallback = acl, acl.media, fallback
        self._lock = threading.Lock()  # DVPP's channel and stream
        # images by what decoded them (OUTCOMES), for /metrics (aclserve_dvpp_decodes); a lock
        # of their own: an image for the CPU must not wait on DVPP's to be counted
        self.outcomes: collections.Counter[str] = collections.Counter()
        self._counts_lock = threading.Lock()
        self._warned = False
        self._hung = False  # a task did not finish: DVPP is given up, its buffers left to it
        self._ctx = self._stream = self._channel = None
        self._claim = None  # (ledger, need): its context and stream, counted on the device's ledger
        # the JPEG, JPEGD's picture and VPC's, kept from one image to the next
        self._jpeg, self._decoded, self._resized = self._kept = tuple(KeptBuffer(self._media) for _ in range(3))
        try:
            # set_device through the runtime, which resets it at close; its ledger counts the context
            # and stream made here, so a load near the limit gets its refusal, not create_stream's 207008
            ledger = runtime.device(device_id).ledger
            need = ledger.context_need(1)
            ledger.claim(need, "the DVPP decoder (a context and its stream)")
            self._claim = (ledger, need)
            soc = soc_name(acl)
            self._width_align, self._vpc_output = jpegd_width_align(soc), vpc_output(soc)
            with restoring_context(acl):
                self._ctx = check("rt.create_context", acl.rt.create_context(device_id))
                self._stream = check("rt.create_stream", acl.rt.create_stream())
                self._channel = check_handle("media.dvpp_create_channel_desc", self._media.dvpp_create_channel_desc())
                check("media.dvpp_create_channel", self._media.dvpp_create_channel(self._channel))
        except Exception as e:
            self.close()
            raise DvppError(f"{type(e).__name__}: {e}") from None

    def __call__(self, data, plan: ImagePlan) -> np.ndarray:
        info = probe(data)
        if not dvpp_takes(info, plan, self._vpc_output):
            self._count(NOT_TAKEN)
            return self._fallback(data, plan)
        check_size(info, self._fallback.max_pixels, self._fallback.max_side)
        check_work(info, self._fallback.max_scan_pixels)
        outcome = GIVEN_UP
        try:
            with self._lock, using_context(self._acl, self._ctx):
                if not self._hung:
                    pixels = self._decode(data, info, plan)
                    self._count(DECODED)
                    return pixels
        except DvppHung as e:  # (set _hung under the lock: no image waits on the chip after it)
            log.error("%s; DVPP is given up (its buffers are left to it) and images decode on the CPU", e)
        except Exception as e:  # anything DVPP does wrong: the CPU decodes it (README, Status)
            outcome = FAILED
            if not self._warned:
                self._warned = True
                log.warning("DVPP decode failed (%s: %s); this and later failures decode on the CPU",
                            type(e).__name__, e)
        self._count(outcome)
        return self._fallback(data, plan)

    def _count(self, outcome: str) -> None:
        with self._counts_lock:  # decodes run in several pool threads
            self.outcomes[outcome] += 1

    def outcome_counts(self) -> dict[str, int]:
        """A copy of `outcomes`, taken under their lock (a decode adding an outcome meanwhile
        would change the dict under a copy made without it)."""
        with self._counts_lock:
            return dict(self.outcomes)

    def _decode(self, data: bytes | memoryview, info: ImageInfo, plan: ImagePlan) -> np.ndarray:
        acl, media = self._acl, self._media
        undo = []  # what to free after the image; nothing when the chip may still use it (DvppHung)
        try:
            # the picture's address where it lies (often a memoryview into the request body): bytes(data)
            # for bytes_to_ptr, which takes bytes only, was a whole copy of it, uncharged. pyACL takes an
            # address as an int, as nv12's below (numpy_to_ptr is the 5.x API, deprecated from 6.0)
            picture = np.frombuffer(data, np.uint8)
            host, size = picture.ctypes.data, picture.size
            w, h, _components, ret = media.dvpp_jpeg_get_image_info(host, size)
            check("media.dvpp_jpeg_get_image_info", ret)
            if (w, h) != (info.width, info.height):
                raise DvppError(f"JPEGD reads {w}x{h} where the header says {info.width}x{info.height}")
            src = self._jpeg.take(size, undo)
            check("rt.memcpy", acl.rt.memcpy(src, size, host, size, C.ACL_MEMCPY_HOST_TO_DEVICE))  # its one copy
            predicted = check("media.dvpp_jpeg_predict_dec_size",
                              media.dvpp_jpeg_predict_dec_size(host, size, PIXEL_FORMAT_YUV_SEMIPLANAR_420))
            # the descriptor's size is the strides' (VPC reads it so); the buffer holds what JPEGD predicts too
            dec_w, dec_h = _align(w, self._width_align), _align(h, JPEGD_HEIGHT_ALIGN)
            dec_size = dec_w * dec_h * 3 // 2
            dec = self._decoded.take(max(dec_size, predicted), undo)
            decoded = self._pic(dec, dec_size, w, h, dec_w, dec_h, undo)
            check("media.dvpp_jpeg_decode_async",
                  media.dvpp_jpeg_decode_async(self._channel, src, size, decoded, self._stream))
            self._wait(undo)
            out_w = max(VPC_MIN_WIDTH_STRIDE, _align(plan.width, VPC_WIDTH_ALIGN))
            out_h = _align(plan.height, VPC_HEIGHT_ALIGN)
            out_size = out_w * out_h * 3 // 2
            out = self._resized.take(out_size, undo)
            resized = self._pic(out, out_size, plan.width, plan.height, out_w, out_h, undo)
            config = check_handle("media.dvpp_create_resize_config", media.dvpp_create_resize_config())
            undo.append(lambda: release("media.dvpp_destroy_resize_config", media.dvpp_destroy_resize_config(config)))
            check("media.dvpp_vpc_resize_async",
                  media.dvpp_vpc_resize_async(self._channel, decoded, resized, config, self._stream))
            self._wait(undo)
            nv12 = np.empty(out_size, np.uint8)
            check("rt.memcpy", acl.rt.memcpy(nv12.ctypes.data, out_size, out, out_size, C.ACL_MEMCPY_DEVICE_TO_HOST))
        finally:
            for undo_step in reversed(undo):
                undo_step()
        return nv12_to_pixels(nv12, out_w, out_h, plan)

    def _wait(self, undo: list) -> None:
        """The stream's tasks, for DVPP_WAIT_MS at most; past it DvppHung, with `undo` emptied:
        the chip may still write the buffers, so they are not freed."""
        try:
            synchronize_stream(self._acl, self._stream, DVPP_WAIT_MS)
        except AclError as e:
            if e.ret != C.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT:
                raise
            undo.clear()
            for kept in self._kept:
                kept.leave()
            self._hung = True
            raise DvppHung(f"a DVPP task did not finish within {DVPP_WAIT_MS} ms") from e

    def _pic(self, ptr: int, size: int, w: int, h: int, width_stride: int, height_stride: int, undo: list) -> int:
        media = self._media
        pic = check_handle("media.dvpp_create_pic_desc", media.dvpp_create_pic_desc())
        undo.append(lambda: release("media.dvpp_destroy_pic_desc", media.dvpp_destroy_pic_desc(pic)))
        for setter, value in (("data", ptr), ("size", size), ("format", PIXEL_FORMAT_YUV_SEMIPLANAR_420),
                              ("width", w), ("height", h), ("width_stride", width_stride),
                              ("height_stride", height_stride)):
            check(f"media.dvpp_set_pic_desc_{setter}", getattr(media, f"dvpp_set_pic_desc_{setter}")(pic, value))
        return pic

    def close(self) -> None:
        """Free the kept buffers, destroy the channel, stream and context, in reverse order, and
        give their claim back to the ledger. Safe twice. After a task that did not finish they are
        left as they are (destroying a channel or stream with work on it may block or fail on
        CANN), still counted: the process's exit gives them back."""
        acl = self._acl
        if self._hung:
            log.warning("DVPP's channel, stream and context are left to the device: a task on them did not finish")
            self._ctx = self._stream = self._channel = None
            return
        with restoring_context(acl):
            if self._ctx is not None:
                release("rt.set_context", acl.rt.set_context(self._ctx))
                for kept in self._kept:
                    kept.free()
            if self._channel is not None:
                release("media.dvpp_destroy_channel", self._media.dvpp_destroy_channel(self._channel))
                release("media.dvpp_destroy_channel_desc", self._media.dvpp_destroy_channel_desc(self._channel))
                self._channel = None
            if self._stream is not None:
                release("rt.destroy_stream", acl.rt.destroy_stream(self._stream))
                self._stream = None
            if self._ctx is not None:
                release("rt.destroy_context", acl.rt.destroy_context(self._ctx))
                self._ctx = None
        claim, self._claim = self._claim, None
        if claim is not None:
            ledger, need = claim
            ledger.release(need)


class KeptBuffer:
    """One of DvppDecoder's DVPP buffers, kept from one image to the next: CANN's acldvppMalloc
    page advises against allocating and freeing per image (it costs time, and the huge pages it
    takes may run short). It grows to the next power of two of the largest size asked, from
    KEPT_MIN_BYTES; a size over KEPT_MAX_BYTES gets a buffer of its own, freed after its image
    (`undo`). Used under the decoder's lock and context."""

    def __init__(self, media):
        self._media = media
        self.ptr, self.capacity = None, 0

    def take(self, size: int, undo: list) -> int:
        if size <= self.capacity:
            return self.ptr
        if size > KEPT_MAX_BYTES:
            ptr = check("media.dvpp_malloc", self._media.dvpp_malloc(size))
            undo.append(lambda: release("media.dvpp_free", self._media.dvpp_free(ptr)))
            return ptr
        self.free()
        capacity = min(max(KEPT_MIN_BYTES, 1 << (size - 1).bit_length()), KEPT_MAX_BYTES)
        self.ptr = check("media.dvpp_malloc", self._media.dvpp_malloc(capacity))
        self.capacity = capacity
        return self.ptr

    def free(self) -> None:
        if self.ptr is not None:
            release("media.dvpp_free", self._media.dvpp_free(self.ptr))
            self.ptr, self.capacity = None, 0

    def leave(self) -> None:
        """Forget the buffer without freeing it: a task that did not finish may still write it."""
        self.ptr, self.capacity = None, 0


# JPEG's full-range BT.601 (as libjpeg's): what each chroma sample, less 128, adds to a channel
_CHROMA_TERMS = ((0.0, 1.402), (-0.344136, -0.714136), (1.772, 0.0))  # (U, V) weights for R, G, B
STRIP_CHROMA_ROWS = 32  # NV12 converts 64 pixel rows at a time: about 1 MB of work at 4,096 wide


def nv12_to_pixels(nv12: np.ndarray, stride_w: int, stride_h: int, plan: ImagePlan) -> np.ndarray:
    """NV12 (Y plane, then interleaved U/V at half resolution) -> uint8 [H, W, C] per the plan
    (whose sides are even: dvpp_takes). A grey picture is a view of the Y plane. An RGB one is
    made in strips of rows: each channel's chroma term worked out once per U/V pair and added to
    the pair's 2 x 2 luma pixels by broadcasting, in one int16 strip reused by each channel, so
    the picture is the only full-size array made. Made with float32 planes and their upsampled
    copies, it held 48 bytes a pixel besides the NV12 (10 charged: images/peak.py)."""
    h, w = plan.height, plan.width
    y = nv12[:stride_w * stride_h].reshape(stride_h, stride_w)[:h, :w]
    if plan.color == "gray":
        return y[:, :, None]
    uv = nv12[stride_w * stride_h:].reshape(stride_h // 2, stride_w // 2, 2)[:h // 2, :w // 2]
    pixels = np.empty((h, w, 3), np.uint8)
    quads, luma = pixels.reshape(h // 2, 2, w // 2, 2, 3), y.reshape(h // 2, 2, w // 2, 2)
    channels = (2, 1, 0) if plan.color == "bgr" else (0, 1, 2)
    for top in range(0, h // 2, STRIP_CHROMA_ROWS):
        rows = slice(top, top + STRIP_CHROMA_ROWS)
        work = np.empty(luma[rows].shape, np.int16)
        for channel, weights in zip(channels, _CHROMA_TERMS):
            np.add(luma[rows], _chroma_term(uv[rows], weights)[:, None, :, None], out=work)
            np.clip(work, 0, 255, out=work)
            np.copyto(quads[rows, ..., channel], work, casting="unsafe")
    return pixels


def _chroma_term(uv: np.ndarray, weights: tuple[float, float]) -> np.ndarray:
    """int16 [H/2, W/2]: one channel's rounded chroma term per U/V pair (float32 work)."""
    term = np.zeros(uv.shape[:2], np.float32)
    for k, weight in enumerate(weights):
        if weight:
            part = uv[:, :, k].astype(np.float32)
            part -= 128.0
            part *= weight
            term += part
    return np.rint(term, out=term).astype(np.int16)
