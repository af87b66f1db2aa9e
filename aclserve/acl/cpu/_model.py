"""Loaded models of the CPU runtime: ORT sessions fed straight from device buffers.

A LoadedModel owns its ONNX Runtime session and the device memory the runtime allocated for it
(load_from_file/load_from_mem); with *_with_mem the caller owns the memory. The ONNX payload
is read (or copied) once into the weight memory and the session is built from it in place
(_weights: ORT gets a skeleton and views of the weight memory for the large initializers, which
it packs into tensors of its own), so the device memory figure is real and a load needs about
twice the weights at its peak, not five times. ORT's own intermediate tensors live in ORT's
allocator, not in the work memory.

A model holds its work and weight memory while loaded (_memory.use), the caller's of *_with_mem
included, which pyACL says to keep until after unload: a free of it before then succeeds, as the
driver's does (it does not know GE uses it), but stays mapped until unload, and the model's
executions fail with 507011 (on a device they would run on freed memory).

A model belongs to the context current at load: execute, execute_async and unload under
another context fail with 107004 ("model not in current context"), as on the device.

Execution binds the data buffers' addresses with IOBinding (no copies) at the gear the input
dataset was set to (set_dynamic_batch_size records it on the dataset); the gear and every
buffer's address and size are read at the call (Dataset.blobs), as the device does, not when a
queued execution runs. A run ONNX Runtime fails returns the code _ort_failures.py gives it, and
acl.get_recent_err_msg says why (the model's own failure, or its header and graph disagreeing at
that batch). A model id is not re-entrant: its lock is taken without waiting
and a second concurrent execution fails with 507011, as on the NPU. ORT releases the GIL while
running.
"""
from __future__ import annotations

import ctypes
import itertools
import logging
import threading

from .. import constants as C
from . import _err_msg, _memory, _om, _safe_division, _state, _weights, faults, settings
from ._ort_failures import host_short, out_of_descriptors, run_failed
from ._dataset import Blob, Dataset

log = logging.getLogger("aclserve.acl.cpu")

_ids = itertools.count(1)
models: dict[int, "LoadedModel"] = {}
_BINDING_CACHE_LIMIT = 64
_PAD_TOLERANCE = 64  # GE accepts a buffer up to 64 bytes smaller than the tensor
# where each input and output starts: aclrtMalloc's alignment, and CANN's for each piece an
# application cuts from one block (pyACL reference section 4: "at a 64-byte-aligned offset")
_IO_ALIGN = 64


def _session(weight_ptr: int, length: int):
    """(session, what must outlive it) for the ONNX model at weight_ptr."""
    import onnxruntime as ort  # deferred: importing ORT costs time the rest of the API does not need

    # ORT's own log is off (FATAL only, which ends the process anyway): its coloured lines went to
    # stderr past aclserve's log, breaking --log-format json; the reason of a failed run is in the
    # exception, which run() logs (its telemetry is off too: aclserve/__init__.py)
    ort.set_default_logger_severity(4)
    so = ort.SessionOptions()
    so.intra_op_num_threads = settings.threads()
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 4
    # (its integer divisions made safe first: INT_MIN / -1 traps, ending the process; _safe_division)
    return _weights.session(weight_ptr, length, so, lambda model, options: ort.InferenceSession(
        _safe_division.rewritten(model), options, providers=["CPUExecutionProvider"]))


class LoadedModel:
    """One model id. Owns its session and runtime-allocated memory; close() is idempotent."""

    def __init__(self, model_id: int, context, info: _om.ModelInfo, session, owned: list[int], weights,
                 memory: _memory.Held):
        self.id, self.info, self.session = model_id, info, session
        self._weights = weights  # views of the weight memory the session was given: they outlive it
        self.context, self.device = context, context.device  # load, execute and unload share it
        self._owned = owned
        self._memory = memory  # its work and weight allocations, held (_memory.use) until close
        self.lock = threading.Lock()
        self.closed = False
        # The gear last set by set_dynamic_batch_size: GE keeps it per model (not per dataset or
        # run), and get_cur_output_dims reads it; None until a first set.
        self.set_batch: int | None = None
        self._bindings: dict = {}
        inputs, outputs = info.inputs, info.outputs
        self._in_min = [max(t.size - _PAD_TOLERANCE, 0) for t in inputs]  # (GE checks the size it reports)
        self._out_min = [max(t.size - _PAD_TOLERANCE, 0) for t in outputs]
        self._onnx_in = [i for i in range(len(inputs)) if i != info.mbatch_index]
        # a header whose sizes are smaller than what its graph binds (a hand-made stand-in for an ATC
        # OM taking YUV420SP, say) describes itself as the device would, but cannot run here (a
        # larger one, a device's padded buffer, can: the graph binds its own bytes of it)
        self._unrunnable = [f"{t.name!r} ({t.size} bytes reported, {t.size_at(info.max_batch)} in its graph)"
                            for t in inputs + outputs if t.size < t.size_at(info.max_batch)]

    def close(self) -> None:
        with self.lock:  # waits for a running execution
            self.closed = True
            owned, self._owned = self._owned, []
            self.session = None
            self._bindings.clear()
            self._weights = ()
        _release(owned, self._memory)  # (a second close: nothing left to release)

    def validate(self, ins: tuple[Blob, ...], outs: tuple[Blob, ...], gear: int) -> int:
        """Checks done when execute/execute_async is called, on the buffers and gear taken then
        (the gear buffer is read when it runs)."""
        if len(ins) != len(self._in_min) or len(outs) != len(self._out_min):
            # one buffer per input and per output: the OM2 executor refuses any other count with
            # 100000 ("Input/Output blobs size mismatch", hicann/ge model_om2.cpp
            # Om2GetModelTensorDesc); the classic executor's answer to extra buffers is unverified,
            # so they are refused here too
            log.error("model %d: %d input and %d output buffers for its %d inputs and %d outputs",
                      self.id, len(ins), len(outs), len(self._in_min), len(self._out_min))
            return C.ACL_ERROR_INVALID_PARAM
        ret = self._gear_ok(gear)
        if ret:
            return ret
        for buf, need in zip(ins, self._in_min):
            if buf.size < need:
                return C.ACL_ERROR_GE_PARAM_INVALID
        for buf, need in zip(outs, self._out_min):
            if buf.size < need:
                return C.ACL_ERROR_GE_PARAM_INVALID
        unaligned = [buf.addr for buf in ins + outs if buf.addr % _IO_ALIGN and _memory.touches_device(buf.addr, 1)]
        if unaligned:
            # a piece of device memory: refused as memcpy_async refuses such an address (107000);
            # what a device does with one is unverified (a misaligned access at best fails the
            # task). Memory that is no device memory is refused when it runs (145000), as before.
            log.error("model %d: buffer address %#x is not %d-byte aligned (each piece cut from one malloc "
                      "block must start at a %d-byte-aligned offset)", self.id, unaligned[0], _IO_ALIGN, _IO_ALIGN)
            return C.ACL_ERROR_RT_PARAM_INVALID
        m = self.info.mbatch_index
        if m is not None:
            if ins[m].addr == 0:
                return C.ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID
            if ins[m].size < 4:
                return C.ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID
        return C.ACL_SUCCESS

    def _gear_ok(self, gear: int) -> int:
        """The input dataset's gear (Dataset.gear), for a dynamic-batch model. The device runs with
        the dataset's record, not the buffer's bytes (ModelExecute passes
        dataset->dynamicBatchSize; GeExecutor::ExecModel marks the run dynamic only when it is not
        0, and one that matches no gear runs the first gear's branch). What the device does with
        a gear model and a dataset never set (0) is unverified: refused here, with GE's code for a
        batch that is not a gear (145013), as is a record that is no gear."""
        if self.info.mbatch_index is None or gear in self.info.gears:
            return C.ACL_SUCCESS
        if gear == 0:
            log.error("model %d: set_dynamic_batch_size was never called on this input dataset: a gear model "
                      "runs at the gear (%s) set on its dataset, whatever %s holds", self.id, self.info.gears,
                      C.ACL_DYNAMIC_TENSOR_NAME)
        else:
            log.error("model %d: the input dataset was last set to batch %d, not a compiled gear %s",
                      self.id, gear, self.info.gears)
        return C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID

    def _batch(self, ins: tuple[Blob, ...], gear: int) -> tuple[int, int]:
        """The batch to run: `gear`, the dataset's record at the call. Its gear buffer must still
        hold it when the run starts: on the device the graph's branch switch reads that buffer
        while GE runs at the dataset's gear, and a buffer written since the set (shared with
        another dataset, or copied over) has no defined result there (unverified): refused (145013)."""
        m = self.info.mbatch_index
        if m is None:
            return 1, C.ACL_SUCCESS
        buf = ins[m]
        nbytes = 8 if buf.size >= 8 else 4
        taken = _memory.use(None, [(buf.addr, nbytes)])
        if taken is None:
            if not _memory.pinned(buf.addr, nbytes):  # in no memory (freed, or never allocated)
                return 0, C.ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID
            text = f"input {self.info.inputs[m].name!r} at {buf.addr:#x} is malloc_host memory, not device memory"
            log.error("model %d: %s", self.id, text)
            _err_msg.report(text)
            return 0, C.ACL_ERROR_GE_PARAM_INVALID  # as _use_io refuses any other input there
        with taken:
            held = (ctypes.c_int64 if nbytes == 8 else ctypes.c_int32).from_address(buf.addr).value
        if held != gear:
            log.error("model %d: %s holds %d, but the input dataset was set to batch %d (its buffer was written "
                      "after set_dynamic_batch_size)", self.id, C.ACL_DYNAMIC_TENSOR_NAME, held, gear)
            return 0, C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
        return gear, C.ACL_SUCCESS

    def _use_io(self, batch: int, in_addrs, out_addrs):
        """The device allocations of the inputs and outputs at `batch` (on the board malloc_host's
        too: the device's memory there), held while it runs (_memory.use: a free meanwhile unmaps
        them once it is done), or None when one is not (any more) memory of the model's device."""
        info = self.info
        spans = [(addr, t.size_at(batch)) for addr, t in zip(in_addrs, info.onnx_inputs)]
        spans += [(addr, t.size_at(batch)) for addr, t in zip(out_addrs, info.outputs)]
        return _memory.use(self.device, spans)

    def inputs_bound(self, batch: int, in_addrs):
        """A new io binding of the session with the inputs at `in_addrs` bound at `batch`."""
        binding = self.session.io_binding()
        for addr, t in zip(in_addrs, self.info.onnx_inputs):
            binding.bind_input(t.onnx_name, "cpu", 0, t.dtype, t.shape_at(batch), addr)
        return binding

    def _binding(self, batch: int, in_addrs, out_addrs):
        binding = self.inputs_bound(batch, in_addrs)
        for addr, t in zip(out_addrs, self.info.outputs):
            binding.bind_output(t.onnx_name, "cpu", 0, t.dtype, t.shape_at(batch), addr)
        if len(self._bindings) >= _BINDING_CACHE_LIMIT:
            self._bindings.clear()
        self._bindings[(batch, in_addrs, out_addrs)] = binding
        return binding

    def _run_bound(self, batch: int, in_addrs, out_addrs) -> int:
        binding = self._bindings.get((batch, in_addrs, out_addrs)) or self._binding(batch, in_addrs, out_addrs)
        code = faults.trigger("execute", self.id, self.device, self.info.name)
        if code:
            return code
        try:
            self.session.run_with_iobinding(binding)
        except Exception as e:  # the model's (its header and graph disagreeing, a division by zero), or the host's
            return run_failed(self, batch, in_addrs, e)
        return C.ACL_SUCCESS

    def run(self, ins: tuple[Blob, ...], outs: tuple[Blob, ...], gear: int) -> int:
        """Execute now in the calling thread (the sync call, or a stream worker) on the buffers
        and at the gear the datasets had when execute/execute_async was called."""
        if not self.lock.acquire(blocking=False):
            log.error("model %d is already executing: a model id is not re-entrant "
                      "(load the model again for parallel execution)", self.id)
            return C.ACL_ERROR_RT_MODEL_EXECUTE
        try:
            if self.closed:
                return C.ACL_ERROR_GE_EXEC_MODEL_ID_INVALID
            if any(alloc.freed for alloc in self._memory):
                log.error("model %d: its work or weight memory was freed while it is loaded (memory given to "
                          "load_from_*_with_mem is kept until after unload)", self.id)
                return C.ACL_ERROR_RT_MODEL_EXECUTE
            if self._unrunnable:
                text = (f"the CPU runtime cannot execute the model: its header's sizes are not its ONNX graph's: "
                        f"{', '.join(self._unrunnable)}")
                log.error("model %d: %s", self.id, text)
                _err_msg.report(text)
                return C.ACL_ERROR_GE_PARAM_INVALID
            batch, ret = self._batch(ins, gear)
            if ret:
                return ret
            in_addrs = tuple([ins[i].addr for i in self._onnx_in])
            out_addrs = tuple([b.addr for b in outs[:len(self._out_min)]])
            io = self._use_io(batch, in_addrs, out_addrs)
            if io is None:
                log.error("model %d: an input or output buffer is not inside device memory of device %d",
                          self.id, self.device)
                return C.ACL_ERROR_GE_PARAM_INVALID
            with io:
                return self._run_bound(batch, in_addrs, out_addrs)
        except Exception:
            log.exception("model %d: execution failed", self.id)
            return C.ACL_ERROR_RT_MODEL_EXECUTE
        finally:
            self.lock.release()


def _device_region_ok(ptr: int, size: int, device: int) -> bool:
    alloc = _memory.find(ptr, size)
    return alloc is not None and alloc.device == device


def load(ctx, info: _om.ModelInfo, payload: _om.Payload, mem: tuple[int, int, int, int] | None = None):
    """(model_id, ret). mem = (work_ptr, work_size, weight_ptr, weight_size); 0 pointers mean
    the runtime allocates that part itself, as aclmdlLoadFromFileWithMem allows."""
    code = faults.trigger("load", 0, name=info.name)
    if code:
        return 0, code
    work_need, weight_need = _om.query_size(info)
    work_ptr, work_size, weight_ptr, weight_size = mem or (0, 0, 0, 0)
    for ptr, size, need in ((work_ptr, work_size, work_need), (weight_ptr, weight_size, weight_need)):
        if ptr and (size < need or not _device_region_ok(ptr, size, ctx.device)):
            log.error("model memory at %#x (%d bytes) is not a device allocation of at least %d bytes",
                      ptr, size, need)
            return 0, C.ACL_ERROR_GE_PARAM_INVALID
    owned: list[int] = []
    for which, need in (("work", work_need), ("weight", weight_need)):
        if (work_ptr if which == "work" else weight_ptr):
            continue
        ptr, ret = _memory.malloc(ctx.device, need, C.ACL_MEM_MALLOC_HUGE_FIRST)
        if ret:
            _release(owned)
            return 0, ret
        owned.append(ptr)
        if which == "work":
            work_ptr = ptr
        else:
            weight_ptr = ptr
    memory = _memory.use(ctx.device, [(work_ptr, work_need), (weight_ptr, weight_need)])
    if memory is None:  # the caller's freed since the check, by another thread
        _release(owned)
        return 0, C.ACL_ERROR_GE_PARAM_INVALID
    model, ret = None, C.ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID
    try:
        model, ret = _opened(ctx, info, payload, owned, memory, weight_ptr)
    finally:  # (a failure, or an exception unforeseen: a MemoryError, an interrupt; the memory goes back)
        if model is None:
            _release(owned, memory)
    if ret:
        return 0, ret
    with _state.lock:
        models[model.id] = model
    return model.id, C.ACL_SUCCESS


def _opened(ctx, info, payload, owned: list[int], memory, weight_ptr: int) -> tuple[LoadedModel | None, int]:
    """The model, its weights copied into `weight_ptr` and read by ONNX Runtime, or (None, the
    code its load fails with); the caller releases the memory when it is None."""
    try:
        payload.copy_to(weight_ptr)
    except (OSError, ValueError) as e:  # (a short read, the checksum: container.OmFormatError)
        log.info("model %r is not a loadable CPU OM: %s", info.name, e)
        return None, C.ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID
    try:
        session, weights = _session(weight_ptr, payload.length)
        names = {i.name for i in session.get_inputs()}, {o.name for o in session.get_outputs()}
        missing = (({t.onnx_name for t in info.onnx_inputs} ^ names[0])
                   | ({t.onnx_name for t in info.outputs} - names[1]))
        if missing:
            raise ValueError(f"header and ONNX graph disagree on tensors {sorted(missing)}")
    except Exception as e:
        log.error("model %r cannot be loaded into ONNX Runtime: %s", info.name, e)
        # the host out of memory or threads is not the file's fault (a device's load says so too)
        if host_short(e):
            return None, C.ACL_ERROR_BAD_ALLOC
        return None, C.ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID if out_of_descriptors(e) else \
            C.ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID
    return LoadedModel(next(_ids), ctx, info, session, owned, weights, memory), C.ACL_SUCCESS


def _release(owned: list[int], memory: _memory.Held | None = None) -> None:
    """Let go of a model's memory and free what the runtime allocated for it."""
    if memory is not None:
        memory.release()
    for ptr in owned:
        _memory.free(ptr)


def unload(ctx, model_id: int) -> int:
    with _state.lock:
        model = models.get(model_id)
        if model is None:
            return C.ACL_ERROR_GE_EXEC_MODEL_ID_INVALID
        if model.context is not ctx:
            return C.ACL_ERROR_RT_MODEL_CONTEXT
        del models[model_id]
    model.close()
    return C.ACL_SUCCESS


def set_dynamic_batch_size(model_id: int, ds: Dataset, index: int, batch: int) -> int:
    """Record the batch on the dataset and write it into the dynamic-batch buffer now
    (synchronous, not stream-ordered).

    Checks in aclmdlSetDynamicBatchSize's order: ACL's (batch, a buffer at `index`, its
    address: 100000), then GE's (buffer length 145012, model id 145003, a compiled gear 145013;
    a static model has none, so it gets 145013 too). ACL records the batch on the dataset
    between the two (`dataset->dynamicBatchSize = batchSize`, hicann/ge model.cpp), so a batch
    GE refuses stays recorded: an execution with that dataset is refused (LoadedModel._gear_ok)."""
    if batch <= 0 or not 0 <= index < len(ds.buffers):
        return C.ACL_ERROR_INVALID_PARAM
    buf = ds.buffers[index].blob  # (None: destroyed, by another thread since mdl's check)
    if buf is None or buf.addr == 0:  # ACL's own check, before GE (whose 145011 this API never reaches)
        return C.ACL_ERROR_INVALID_PARAM
    ds.gear = batch
    if buf.size < 4:
        return C.ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID
    model = models.get(model_id)
    if model is None:
        return C.ACL_ERROR_GE_EXEC_MODEL_ID_INVALID
    info = model.info
    if batch not in info.gears:
        return C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
    model.set_batch = batch  # GE records it before the write (DavinciModel::SetDynamicSize)
    if index != info.mbatch_index:
        # Stricter than the device, which writes the value into whatever buffer sits at `index`
        # (a data input then holds garbage): here that mistake is refused instead.
        return C.ACL_ERROR_INVALID_PARAM
    nbytes = 8 if buf.size >= 8 else 4
    if not _memory.addressable(buf.addr, nbytes, None):
        return C.ACL_ERROR_RT_PARAM_INVALID
    (ctypes.c_int64 if nbytes == 8 else ctypes.c_int32).from_address(buf.addr).value = batch
    return C.ACL_SUCCESS


def _unload_all() -> None:
    with _state.lock:
        live = list(models.values())
        models.clear()
    for model in live:
        model.close()


_state.on_finalize(_unload_all)
_state.on_fork_child(models.clear)  # the parent's models are not the child's (_state.forget_in_child)
