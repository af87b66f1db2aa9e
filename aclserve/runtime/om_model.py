"""One loaded OM: huge-page work/weight memory, the model id, its descriptor as TensorSpecs.

Load and unload must run in the same ACL context (the owning instance's); the caller makes
that context current before constructing and before close(). A model id is not re-entrant,
so every instance loads its own OmModel.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os

from ..acl import AclError, check, check_handle, release
from ..acl import constants as C
from ..dtypes import acl_to_kserve, acl_to_numpy, acl_type
from ..om import container
from ..om.atc_om import NotAnOm, compile_hint, identify
from ..om.container import OmFormatError
from ..om.names import tensor_name
from .batch_axes import refuse_outputs_not_batch_first
from .device import Device, LoadError
from .types import TensorSpec
from .unread_file import host_short, short_of_reading, unread_file

log = logging.getLogger(__name__)


# a file the ACL could not open or read: the file's fault, or the host short (unread_file.py)
_UNREAD = C.ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID
_FILE_REFUSED = (_UNREAD, C.ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID)
# inputs whose name says what the model is (_refuse_other_dynamics), whatever their shape
_REFUSED_BY_NAME = (C.ACL_DYNAMIC_AIPP_NAME, C.ACL_DYNAMIC_TENSOR_NAME)


def _why_unloadable(name: str, path: str, refusal: AclError) -> str:
    """Say what a file the ACL refused is, and what to do about it. Raises the host-short
    LoadError of unread_file.py when the server cannot read it either for want of descriptors
    or memory: that says nothing of the file."""
    try:
        kind, header = identify(path)
    except OSError as e:
        if short_of_reading(e):
            raise host_short(name, path, e, refusal)  # (not `from None`: its cause says transient)
        return f"is not a loadable OM: {e}{compile_hint(path)}"
    except NotAnOm as e:  # (its words say "not an OM file" or "not a loadable OM" already)
        return f"is {e}{compile_hint(path)}"
    except OmFormatError as e:
        return f"is not a loadable OM: {e}{compile_hint(path)}"  # (the Engine takes OMs only)
    if kind == "cpu_om":
        # (either host: an Ascend one cannot load it, the CPU runtime refuses a malformed one)
        fault = _cpu_om_fault(name, path, header, refusal)
        return f"is a CPU OM, built for aclserve's CPU runtime, and was refused: {fault}"
    if kind == "atc_om":
        return (f"is an ATC OM ({header.name!r}, built for an Ascend SoC) and needs CANN and an NPU; "
                "for the CPU runtime compile the ONNX model with --target cpu")
    return "is an OM2 archive, which aclserve does not load"


def _cpu_om_fault(name: str, path: str, header: dict, refusal: AclError) -> str:
    """What is wrong with a CPU OM the ACL refused, found as the repository's index and `aclserve
    inspect` find it (its payload read against the header's checksum): the pyACL API answers a
    code only, and a caller of the Engine has no server log to read."""
    try:
        container.verify_payload_file(path, header)
    except OmFormatError as e:
        return f"{e}; compile its ONNX model again (aclserve compile MODEL.onnx, with --target npu on an Ascend host)"
    except OSError as e:
        if short_of_reading(e):
            raise host_short(name, path, e, refusal)
        return f"it cannot be read again ({e.strerror or e})"
    return ("on an Ascend host rebuild it from the ONNX model with ATC (aclserve compile MODEL.onnx --target npu); "
            "on the CPU runtime its header describes no model the runtime can run (the aclserve.acl.cpu log says what)")


class OmModel:
    """Owns: work and weight device memory (HUGE_FIRST), the model id, the model descriptor."""

    def __init__(self, acl, device: Device, path: str, name: str):
        self._acl = acl
        self.device = device
        self.path = os.fspath(path)
        self.name = name
        self.model_id: int | None = None
        self.desc = 0
        self._memory: list[int] = []
        self._closed = False
        with contextlib.ExitStack() as undo:
            undo.callback(self.close)
            self._load()
            try:
                self._describe()
                if self.gears:
                    refuse_outputs_not_batch_first(acl, self)
                self._refuse_sizes_not_of_dims()  # (after the batch axes: a size off by those says less)
            except AclError as e:  # a LoadError with its cause: retried only if the device ran short
                raise LoadError(f"model {self.name}: reading the description of {self.path} failed ({e})") from e
            undo.pop_all()

    # -- loading ---------------------------------------------------------------------------
    def _load(self) -> None:
        acl = self._acl
        if not os.path.isfile(self.path):  # (a folder, a FIFO, a device node: not "does not exist")
            what = "is not a regular file" if os.path.exists(self.path) else "does not exist"
            raise LoadError(f"model {self.name}: file {self.path} {what}")
        try:
            work_size, weight_size = check("mdl.query_size", acl.mdl.query_size(self.path))
        except AclError as e:
            if e.ret in _FILE_REFUSED:
                error = self._file_refused(e)
                raise error from error.__cause__
            self._load_unsized(e)
            return
        self.work_size, self.weight_size = int(work_size), int(weight_size)
        with self.device.room(f"model {self.name}", (self.work_size, self.weight_size)) as took:
            work = self._malloc(self.work_size, took) if self.work_size else 0
            weight = self._malloc(self.weight_size, took) if self.weight_size else 0
        try:
            self.model_id = check("mdl.load_from_file_with_mem", acl.mdl.load_from_file_with_mem(
                self.path, work, self.work_size, weight, self.weight_size))
        except AclError as e:  # its cause kept: a device code is retried (repository/retry.py)
            if e.ret == _UNREAD:
                error = self._file_refused(e)
                raise error from error.__cause__
            raise LoadError(f"model {self.name}: loading {self.path} failed ({e})") from e

    def _file_refused(self, refusal: AclError) -> LoadError:
        """The error of a load the ACL refused for its file: what the file is, or the host short of
        descriptors or memory (unread_file.py), raised from its cause, which retry.py's host_short
        looks for (none but that: `from None` would drop it)."""
        if refusal.ret == _UNREAD:
            return unread_file(self.name, self.path, refusal)
        return LoadError(f"model {self.name}: {self.path} {_why_unloadable(self.name, self.path, refusal)} "
                         f"({refusal})")

    def _load_unsized(self, refusal: AclError) -> None:
        """query_size refused (CANN does for fully dynamic-shape OMs): let CANN allocate with
        load_from_file; a dynamic shape beyond the batch is then refused at _describe."""
        log.warning("model %s: %s; loading with load_from_file, so CANN allocates the model memory "
                    "(no huge-page control, not counted against memory_reserve_fraction)", self.name, refusal)
        self.work_size = self.weight_size = 0
        try:
            self.model_id = check("mdl.load_from_file", self._acl.mdl.load_from_file(self.path))
        except AclError as e:  # its cause kept: a device code is retried (repository/retry.py)
            if e.ret // 100000 == 1:  # a parameter or file code: say what the file is
                error = self._file_refused(e)
                raise error from error.__cause__ or e
            raise LoadError(f"model {self.name}: loading {self.path} failed ({e})") from e

    def _malloc(self, size: int, took) -> int:
        try:
            ptr = check("rt.malloc", self._acl.rt.malloc(size, C.ACL_MEM_MALLOC_HUGE_FIRST))
        except AclError as e:
            raise LoadError(f"model {self.name}: allocating {size:,} bytes of device memory failed ({e})") from e
        self._memory.append(ptr)
        took(size)
        return ptr

    def _describe(self) -> None:
        acl = self._acl
        self.desc = check_handle("mdl.create_desc", acl.mdl.create_desc())
        check("mdl.get_desc", acl.mdl.get_desc(self.desc, self.model_id))
        n_in = acl.mdl.get_num_inputs(self.desc)
        n_out = acl.mdl.get_num_outputs(self.desc)
        gear_info = check("mdl.get_dynamic_batch", acl.mdl.get_dynamic_batch(self.desc))
        self.gears: tuple[int, ...] = tuple(sorted(int(b) for b in gear_info.get("batch", [])))
        self.buffer_rows = self.gears[-1] if self.gears else 1  # rows a tensor's buffer holds
        self.dynamic_index: int | None = None
        if self.gears:
            self.dynamic_index = check("mdl.get_input_index_by_name",
                                       acl.mdl.get_input_index_by_name(self.desc, C.ACL_DYNAMIC_TENSOR_NAME))
        self.input_sizes = [acl.mdl.get_input_size_by_index(self.desc, i) for i in range(n_in)]
        self.output_sizes = [acl.mdl.get_output_size_by_index(self.desc, i) for i in range(n_out)]
        self.inputs = [self._spec(i, True) for i in range(n_in) if i != self.dynamic_index]
        self.outputs = [self._spec(i, False) for i in range(n_out)]
        self.input_indices = [i for i in range(n_in) if i != self.dynamic_index]
        self._refuse_other_dynamics()

    def _refuse_other_dynamics(self) -> None:
        """Only batch gears are served: an OM of dynamic image size, dims or shape, or of dynamic
        AIPP, is refused here by name (its extra input, or a dimension left at -1), not left to
        fail later as a buffer that cannot be laid out."""
        names = {spec.name for spec in self.inputs}
        if C.ACL_DYNAMIC_AIPP_NAME in names:
            raise LoadError(f"model {self.name} takes dynamic AIPP ({C.ACL_DYNAMIC_AIPP_NAME}), which aclserve "
                            "does not serve: compile it with static AIPP (aclserve compile --aipp)")
        if C.ACL_DYNAMIC_TENSOR_NAME in names:
            raise LoadError(f"model {self.name} has dynamic image sizes or dims, not batch gears: aclserve serves "
                            "only a dynamic batch (ATC --dynamic_batch_size); compile it so")
        for spec in self.inputs + self.outputs:
            if any(d < 0 for d in (spec.shape[1:] if self.gears else spec.shape)):
                raise LoadError(f"model {self.name}: tensor {spec.name!r} has the shape {list(spec.shape)}; only "
                                "the batch dimension may be dynamic (with batch gears): compile it with fixed "
                                "dimensions")

    def _spec(self, index: int, is_input: bool) -> TensorSpec:
        mdl = self._acl.mdl
        if is_input:
            name = mdl.get_input_name_by_index(self.desc, index)
            # v2 where pyACL has it: an input behind static AIPP as its buffer is laid out (YUV420SP:
            # [N, 1.5H, W, 1]), whose product is its size; get_input_dims gives the picture's [N, H, W, C]
            dims_v2 = getattr(mdl, "get_input_dims_v2", None)
            dims = (check("mdl.get_input_dims_v2", dims_v2(self.desc, index)) if dims_v2 is not None
                    else check("mdl.get_input_dims", mdl.get_input_dims(self.desc, index)))
            acl_dtype = mdl.get_input_data_type(self.desc, index)
            fmt = mdl.get_input_format(self.desc, index)
            size = self.input_sizes[index]
        else:
            # ATC reports "<node>:<index>:<tensor>"; clients know the ONNX tensor name
            name = tensor_name(mdl.get_output_name_by_index(self.desc, index))
            dims = check("mdl.get_output_dims", mdl.get_output_dims(self.desc, index))
            acl_dtype = mdl.get_output_data_type(self.desc, index)
            fmt = mdl.get_output_format(self.desc, index)
            size = self.output_sizes[index]
        shape = tuple(int(d) for d in dims["dims"])
        if self.gears:
            shape = self._batch_first(name, shape, is_input)
        try:
            datatype = acl_to_kserve(acl_dtype)
        except ValueError:
            raise LoadError(f"model {self.name}: tensor {name!r} has {acl_type(acl_dtype)}, "
                            "which aclserve cannot serve") from None
        aipp_color, raw_aipp_format = self._static_aipp(index, name) if is_input else (None, None)
        return TensorSpec(name=name, datatype=datatype, dtype=acl_to_numpy(acl_dtype), shape=shape,
                          format=C.FORMAT_NAMES.get(fmt, str(fmt)), bytes_per_sample=size // self.buffer_rows,
                          aipp_color=aipp_color, raw_aipp_format=raw_aipp_format)

    def _refuse_sizes_not_of_dims(self) -> None:
        input_sizes = [self.input_sizes[i] for i in self.input_indices]
        for kind, specs, sizes in (("input", self.inputs, input_sizes), ("output", self.outputs, self.output_sizes)):
            for spec, size in zip(specs, sizes):
                self._refuse_size_not_of_dims(spec, size, kind)

    def _refuse_size_not_of_dims(self, spec: TensorSpec, size: int, kind: str) -> None:
        """The slots lay a tensor's buffer out by its dims in the size the model reports: a size
        smaller than the dims need fails the load here (it failed as a numpy reshape error for an
        ATC OM's YUV420SP input read with get_input_dims). A larger one (a padded buffer) loads, as
        it did: rows are laid out by the dims, copies take whole rows of the reported size."""
        rows = self.buffer_rows
        row_bytes = math.prod(spec.sample_shape if self.gears else spec.shape) * spec.dtype.itemsize
        if row_bytes * rows <= size:
            return
        a_row = " a row" if self.gears else ""
        reported = f"{size // rows:,} bytes a row ({size:,} at batch {rows})" if self.gears else f"{size:,} bytes"
        aipp = f" (static AIPP of input format {spec.raw_aipp_format})" if spec.raw_aipp_format else ""
        why = ("" if not spec.raw_aipp_format or hasattr(self._acl.mdl, "get_input_dims_v2") else
               "; this pyACL has no acl.mdl.get_input_dims_v2, which gives the dims of that format's buffer (with "
               "it, the input is served as its raw bytes)")
        raise LoadError(f"model {self.name}: {kind} {spec.name!r}{aipp} has the dims {list(spec.shape)} of "
                        f"{spec.datatype}, {row_bytes:,} bytes{a_row}, but the model reports {reported} for it: "
                        f"aclserve cannot lay out its buffer{why}")

    def _batch_first(self, name: str, shape: tuple[int, ...], is_input: bool) -> tuple[int, ...]:
        """A gear model's tensor with dimension 0 as its batch (-1). An input's batch is
        reported as -1: ATC leaves an input it has no -1 for fixed, and one fixed input is
        refused here, since the batcher fills dimension 0 of every input with the requests'
        rows. An output's batch is reported as the largest gear (batch_axes.py checks it)."""
        if is_input and (not shape or shape[0] != -1) and name not in _REFUSED_BY_NAME:
            raise LoadError(f"model {self.name}: input {name!r} has the shape {list(shape)} in a model of batch "
                            "gears, where aclserve takes dimension 0 of every input as the batch (-1 there): "
                            "compile it with -1 as that input's first dimension, or without gears")
        return (-1,) + shape[1:] if shape and shape[0] > 0 else shape

    def _static_aipp(self, index: int, name: str) -> tuple[str | None, str | None]:
        """(colour, raw format) of input `index`'s static AIPP. The colour is the pixels it takes:
        RGB888 is rgb, or bgr when its AIPP swaps R and B (rbuv_swap_switch: the host sends BGR,
        as ATC's examples and `aclserve compile --image-input bgr` mean it); YUV400 is gray. Any
        other input format (YUV420SP_U8, ...) is the raw format: the input is served as its buffer,
        which images cannot feed. (None, None) without AIPP, or with a note when the call fails:
        the image settings must then say the colour."""
        call = getattr(self._acl.mdl, "get_first_aipp_info", None)  # (a pyACL without it: none said)
        if index == self.dynamic_index or call is None:
            return None, None
        info, ret = call(self.model_id, index)
        if ret in (C.ACL_ERROR_GE_AIPP_NOT_EXIST, C.ACL_ERROR_NOT_STATIC_AIPP):
            return None, None
        if ret != C.ACL_SUCCESS or not info:
            log.info("model %s: input %r: acl.mdl.get_first_aipp_info failed with %s; its image colour order "
                     "is what its settings say", self.name, name, ret)
            return None, None
        input_format = info.get("inputFormat")
        if input_format == C.ACL_YUV400_U8:
            return "gray", None
        if input_format == C.ACL_RGB888_U8:
            return "bgr" if info.get("rbuvSwapSwitch") else "rgb", None
        raw = C.AIPP_FORMAT_NAMES.get(input_format, f"aclAippInputFormat {input_format}")
        log.info("model %s: input %r takes AIPP input format %s, which image inputs do not feed: it is served as "
                 "its raw buffer", self.name, name, raw)
        return None, raw

    # -- teardown ----------------------------------------------------------------------------
    def close(self) -> None:
        """Unload, destroy the descriptor, free the model memory. Safe twice; call in the load context."""
        if self._closed:
            return
        self._closed = True
        acl = self._acl
        if self.desc:
            release("mdl.destroy_desc", acl.mdl.destroy_desc(self.desc))
            self.desc = 0
        if self.model_id is not None:
            release("mdl.unload", acl.mdl.unload(self.model_id))
            self.model_id = None
        while self._memory:
            release("rt.free", acl.rt.free(self._memory.pop()))
