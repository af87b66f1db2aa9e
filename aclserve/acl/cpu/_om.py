"""Read an OM for the CPU runtime: CPU OM containers are accepted, ATC OMs refused with a reason.

Returns ACL codes the way GE does: a missing/unreadable path or an empty file 145002; anything that
is not a loadable CPU OM (shorter than GE's 256-byte header, garbage, truncated, inconsistent header,
ATC "IMOD" OM, OM2 archive) 145006.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import math
import os

from ...dtypes import acl_to_numpy
from ...om import atc_om, container
from ...regular_files import open_regular
from .. import constants as C
from ._aipp import aipp_info, dims_v2

log = logging.getLogger("aclserve.acl.cpu")

_FORMATS = {"UNDEFINED": -1, "NCHW": 0, "NHWC": 1, "ND": 2, "NC1HWC0": 3, "FRACTAL_Z": 4,
            "NC1HWC0_C04": 12, "HWCN": 16, "NDHWC": 27, "FRACTAL_NZ": 29, "NCDHW": 30,
            "NDC1HWC0": 32, "FRACTAL_Z_3D": 33, "NC": 35, "NCL": 47}


class TensorDesc:
    """One model input or output as the descriptor reports it; -1 in dims marks the batch."""

    __slots__ = ("name", "onnx_name", "acl_dtype", "dtype", "format", "dims", "dims_v2", "size", "dynamic_batch",
                 "_sample_bytes")

    def __init__(self, entry: dict):
        # `name` is what the descriptor reports (outputs: ATC's "<node>:<index>:<tensor>" where
        # the header has it); `onnx_name` is the tensor in the ONNX graph that ORT binds.
        self.onnx_name = str(entry["name"])
        self.name = str(entry.get("atc_name") or self.onnx_name)
        self.acl_dtype = entry["acl_dtype"]  # (cpu_header.check fills it in, agreeing with `datatype`)
        self.dtype = acl_to_numpy(self.acl_dtype)
        fmt = entry.get("format", "ND")
        self.format = int(fmt) if isinstance(fmt, int) else _FORMATS.get(str(fmt).upper(), C.ACL_FORMAT_UNDEFINED)
        self.dims = tuple(entry["dims"])
        self.dynamic_batch = bool(entry.get("dynamic_batch", False))
        self._sample_bytes = math.prod(d for d in self.dims if d != -1) * self.dtype.itemsize
        self.dims_v2 = self.dims  # an input behind static AIPP: ModelInfo sets them from its format
        # what get_*_size_by_index reports: a header may record it (GE reads it from the OM's tensor
        # descriptor); the compiler does not, and ModelInfo computes it from dims_v2 at the largest gear
        self.size = entry.get("size")

    def shape_at(self, batch: int) -> tuple[int, ...]:
        return tuple(batch if d == -1 else d for d in self.dims)

    def size_at(self, batch: int) -> int:
        """The bytes its ONNX graph takes at `batch` (what the execution binds)."""
        return self._sample_bytes * (batch if -1 in self.dims else 1)


class ModelInfo:
    """Everything the descriptor APIs report, from the CPU OM header (read by container, which has
    cpu_header check it: the same reading `aclserve inspect` and the repository's file check do)."""

    def __init__(self, header: dict, payload_len: int):
        self.header = header
        self.name = str(header.get("name", ""))
        self.inputs = [TensorDesc(e) for e in header["inputs"]]
        self.outputs = [TensorDesc(e) for e in header["outputs"]]
        self.gears = sorted(int(g) for g in header.get("gears", []) or [])
        dyn = [i for i, t in enumerate(self.inputs) if t.dynamic_batch or t.name == C.ACL_DYNAMIC_TENSOR_NAME]
        self.mbatch_index = dyn[0] if dyn else None
        self.max_batch = self.gears[-1] if self.gears else 1
        self.onnx_inputs = [t for i, t in enumerate(self.inputs) if i != self.mbatch_index]
        # input index -> its static AIPP as get_first_aipp_info reports it (from the compile's
        # summary); the gear input comes after them
        self.aipp = {int(op["related_input_rank"]): aipp_info(op) for op in header.get("aipp", []) or []}
        for op in header.get("aipp", []) or []:
            image_input = self.inputs[int(op["related_input_rank"])]
            image_input.dims_v2 = dims_v2(op["input_format"], image_input.dims)
        for t in self.inputs + self.outputs:
            if t.size is None:
                t.size = math.prod(self.max_batch if d == -1 else d for d in t.dims_v2) * t.dtype.itemsize
        self.payload_len = payload_len

    @property
    def io_bytes(self) -> int:
        return sum(t.size_at(self.max_batch) for t in self.inputs + self.outputs)


# A refusal is logged at info: the code is all the pyACL API answers, and aclserve reads the
# file itself to say why (runtime/om_model.py, repository/validate.py), so a caller of the
# Engine who set up no logging gets the reason in the LoadError and nothing on stderr. What only
# this reading finds (a header describing no model it can run) is an error.
def _refuse_atc(where: str, hdr: atc_om.AtcOmHeader) -> int:
    log.info("%s is an OM built by ATC for an Ascend SoC (model name %r, header version %#010x, "
             "model type %s, encrypted %s, dynamic %s); it needs CANN on an Ascend NPU and cannot "
             "run on the CPU runtime. Compile the source ONNX model for the CPU runtime instead "
             "(aclserve compile model.onnx).", where, hdr.name, hdr.version, hdr.model_type,
             hdr.is_encrypt, hdr.is_dynamic)
    return C.ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID


class Payload:
    """The ONNX bytes of a CPU OM, in memory (load_from_mem: a view of the bytes read) or still in
    its open file (load_from_file, query_size), copied once into the weight memory by copy_to,
    which checks the header's checksum on what it copied. Owns the file until close()."""

    def __init__(self, length: int, sha256: str | None, data: memoryview | None = None, file=None,
                 offset: int = 0):
        self.length, self._sha256 = length, sha256
        self._data, self._file, self._offset = data, file, offset

    def copy_to(self, ptr: int) -> None:
        """Fill [ptr, ptr+length) with the payload; OSError or container.OmFormatError (a short
        read, a checksum mismatch)."""
        dest = memoryview((ctypes.c_char * self.length).from_address(ptr)).cast("B")
        if self._file is None:
            dest[:] = self._data
        else:
            self._file.seek(self._offset)
            done = 0
            while done < self.length:
                n = self._file.readinto(dest[done:])
                if not n:
                    raise container.OmFormatError(f"CPU OM payload cut short at {done} of {self.length} bytes")
                done += n
        self.verify(dest)

    def verify(self, data=None) -> None:
        """The checksum against `data` (default: the payload, the file's read in chunks)."""
        if self._sha256 is None:
            return
        header = {"payload_sha256": self._sha256}
        if data is None and self._file is not None:
            container.verify_payload_in(self._file, self._offset, self.length, header)
        else:
            container.check_digest(hashlib.sha256(self._data if data is None else data), header)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = self._data = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _too_short(size: int, where: str) -> int:
    """The code refusing a model of `size` bytes too short to be an OM, else 0, as GE refuses it
    whatever it holds (hicann/ge base/common/helper/model_parser_base.cc): LoadFromFile takes an
    empty file for none (GetFileLength: "size is 0, not valid"), 145002; ParseModelContent
    refuses fewer bytes than its 256-byte ModelFileHeader, 145006 (a CPU OM too: what the device
    refuses, this runtime refuses)."""
    if size == 0:
        log.info("model file %s cannot be read: the file is empty (0 bytes)", where)
        return C.ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID
    if size < atc_om.HEADER_SIZE:
        log.info("%s is not a loadable OM: too short to be an OM (%d bytes, fewer than GE's %d-byte model file "
                 "header)", where, size, atc_om.HEADER_SIZE)
        return C.ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID
    return 0


def _not_cpu_om(head: bytes, size: int, where: str) -> int:
    """The code refusing an ATC OM or OM2 archive by its first bytes, else 0."""
    if head[:4] == atc_om.ATC_MAGIC:
        hdr = atc_om.parse_atc_header(head[:atc_om.HEADER_SIZE], size)
        if hdr is not None and hdr.consistent_length:
            return _refuse_atc(where, hdr)
    if head[:4] == atc_om.OM2_MAGIC:
        log.info("%s looks like an ATC OM2 archive (zip); it needs CANN and cannot run on the CPU runtime", where)
        return C.ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID
    return 0


def _info(header: dict, payload_len: int, where: str):
    try:
        return ModelInfo(header, payload_len)
    except (KeyError, TypeError, ValueError) as e:  # (what cpu_header.check cannot see: a safety net)
        log.error("%s is not a loadable CPU OM: %s", where, f"field {e} is missing" if isinstance(e, KeyError) else e)
        return None


def parse(data: bytes, where: str):
    """(ModelInfo, Payload, 0) or (None, None, code) for OM bytes (the Payload a view of them)."""
    code = _too_short(len(data), where) or _not_cpu_om(bytes(data[:atc_om.HEADER_SIZE]), len(data), where)
    if code:
        return None, None, code
    try:
        om = container.decode(memoryview(data), verify_payload=False)  # (verified as it is copied)
    except container.OmFormatError as e:
        log.info("%s is not a loadable CPU OM: %s", where, e)
        return None, None, C.ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID
    info = _info(om.header, len(om.payload), where)
    if info is None:
        return None, None, C.ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID
    return info, Payload(len(om.payload), om.header.get("payload_sha256"), data=om.payload), C.ACL_SUCCESS


def read_file(path: str):
    """(ModelInfo, Payload, 0) or (None, None, code): the header read, the payload left in the
    file (the Payload owns it: close it), so the model's bytes are read once, into weight memory."""
    try:
        # GE resolves the path first (RealPath) and refuses one that does not resolve: so does
        # this, e.g. /proc/self/fd/N of a file no folder holds any more, which open() would follow
        os.path.realpath(path, strict=True)
        if not os.path.isfile(path):
            raise FileNotFoundError(path)
        f = open_regular(path)
    except OSError as e:
        log.info("model file %s cannot be read: %s", path, e)
        return None, None, C.ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID
    try:
        size = os.fstat(f.fileno()).st_size
        code = _too_short(size, path) or _not_cpu_om(f.read(atc_om.HEADER_SIZE), size, path)
        if code:
            f.close()
            return None, None, code
        f.seek(0)
        header, offset, length = container.read_header_from(f)
    except OSError as e:
        f.close()
        log.info("model file %s cannot be read: %s", path, e)
        return None, None, C.ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID
    except container.OmFormatError as e:
        f.close()
        log.info("%s is not a loadable CPU OM: %s", path, e)
        return None, None, C.ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID
    info = _info(header, length, path)
    if info is None:
        f.close()
        return None, None, C.ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID
    return info, Payload(length, header.get("payload_sha256"), file=f, offset=offset), C.ACL_SUCCESS


def query_size(info: ModelInfo) -> tuple[int, int]:
    """(work, weight) bytes: the I/O of the largest gear as working memory, the graph as weights."""
    return max(info.io_bytes, 32), max(info.payload_len, 32)
