"""Contract tests for the pyACL API: they run against whichever `acl` aclserve selects.

ACLSERVE_DEVICE=npu runs them on a real Ascend host (expectations that only the CPU runtime can
meet, like CPU OM models or exact memory figures, are skipped there). acl.init is process-wide,
so the `acl` fixture initialises once and never finalises (other suites may share the process);
the init/finalize rules themselves are tested in a subprocess.
"""
from __future__ import annotations

import datetime
import hashlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from aclserve.acl import constants as C
from aclserve.acl import select
from aclserve.dtypes import acl_to_kserve, numpy_to_acl
from aclserve.om import container


@pytest.fixture(scope="session")
def acl_kind():
    return select()[0]


@pytest.fixture
def acl(acl_kind):
    module = select()[1]
    assert module.init() in (C.ACL_SUCCESS, C.ACL_ERROR_REPEAT_INITIALIZE)
    return module


@pytest.fixture
def cpu_only(acl_kind):
    if acl_kind != "cpu":
        pytest.skip("checks a CPU-runtime detail (CPU OM models, exact memory figures, fault injection)")


def _free_bytes(acl):
    free, _, ret = acl.rt.get_mem_info(C.ACL_HBM_MEM)
    assert ret == 0
    return free


@pytest.fixture
def ctx(acl, acl_kind):
    """set_device(0) plus a fresh context current in this thread; checks nothing leaked (CPU)."""
    assert acl.rt.set_device(0) == 0
    context, ret = acl.rt.create_context(0)
    assert ret == 0
    before = _free_bytes(acl)
    yield context
    assert acl.rt.set_context(context) == 0
    after = _free_bytes(acl)
    assert acl.rt.destroy_context(context) == 0
    assert acl.rt.reset_device(0) == 0
    if acl_kind == "cpu":
        assert after == before, "the test leaked device memory"


@pytest.fixture
def device_buffer(acl):
    """malloc(size, policy) that frees at teardown (free errors are ignored: tests may free)."""
    ptrs = []

    def make(size, policy=C.ACL_MEM_MALLOC_NORMAL_ONLY):
        ptr, ret = acl.rt.malloc(size, policy)
        assert ret == 0
        ptrs.append(ptr)
        return ptr

    yield make
    for ptr in ptrs:
        acl.rt.free(ptr)


@pytest.fixture
def host_buffer(acl):
    """`size` bytes of malloc_host memory, from its first 64-byte aligned byte, freed at teardown:
    memcpy_async's host side (through CANN 8.x other host memory, or unaligned addresses, copy
    wrongly without an error; on a board, run mode ACL_DEVICE, malloc_host's memory is not
    64-byte aligned, so it is used from there, as the server's slots do)."""
    blocks = []

    def make(size: int) -> int:
        block, ret = acl.rt.malloc_host(size + 63)
        assert ret == 0
        blocks.append(block)
        return (block + 63) & ~63

    yield make
    for block in blocks:
        acl.rt.free_host(block)


@pytest.fixture
def pinned(acl, host_buffer):
    """`data` (bytes) copied into host_buffer memory: memcpy_async's host side."""
    def make(data: bytes) -> int:
        ptr = host_buffer(len(data))
        assert acl.rt.memcpy(ptr, len(data), acl.util.bytes_to_ptr(data), len(data), C.ACL_MEMCPY_HOST_TO_HOST) == 0
        return ptr

    return make


# -- tiny models as CPU OMs ------------------------------------------------------------------------
IN_FEATURES, HIDDEN, OUT_FEATURES = 32, 8, 3
MBATCH = 1  # index of ascend_mbatch_shape_data in the MLP (listed last among the inputs)


def mlp_onnx(batch: int | str = "batch") -> onnx.ModelProto:
    """x[N,32] -> relu(x@W1+b1)@W2 -> y[N,3], and idx[N] = argmax(y) (int64)."""
    rng = np.random.default_rng(7)
    w1 = rng.standard_normal((IN_FEATURES, HIDDEN)).astype(np.float32)
    b1 = rng.standard_normal(HIDDEN).astype(np.float32)
    w2 = rng.standard_normal((HIDDEN, OUT_FEATURES)).astype(np.float32)
    inits = [helper.make_tensor(n, TensorProto.FLOAT, a.shape, a.ravel()) for n, a in
             (("w1", w1), ("b1", b1), ("w2", w2))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y"]),
             helper.make_node("ArgMax", ["y"], ["idx"], axis=1, keepdims=0)]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, IN_FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, OUT_FEATURES]),
         helper.make_tensor_value_info("idx", TensorProto.INT64, [batch])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _entry(name: str, elem_type: int, dims: list[int]) -> dict:
    acl_dtype = numpy_to_acl(helper.tensor_dtype_to_np_dtype(elem_type))
    return {"name": name, "datatype": acl_to_kserve(acl_dtype), "acl_dtype": acl_dtype,
            "format": "ND", "dims": dims}


def write_cpu_om(path, model: onnx.ModelProto, gears: list[int] | None) -> str:
    """A CPU OM as the compiler would write it: header from the graph, payload = model bytes."""
    def dims_of(vi):
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim]
        assert gears or -1 not in dims, "a static model needs fixed dims"
        return dims

    inits = {i.name for i in model.graph.initializer}
    inputs = [_entry(v.name, v.type.tensor_type.elem_type, dims_of(v)) for v in model.graph.input
              if v.name not in inits]
    if gears:
        inputs.append({"name": C.ACL_DYNAMIC_TENSOR_NAME, "datatype": "INT64", "acl_dtype": C.ACL_INT64,
                       "format": "ND", "dims": [1], "dynamic_batch": True})
    outputs = [_entry(v.name, v.type.tensor_type.elem_type, dims_of(v)) for v in model.graph.output]
    payload = model.SerializeToString()
    header = {"name": model.graph.name, "producer": "tests/contract",
              "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "source": {"path": "memory", "sha256": hashlib.sha256(payload).hexdigest()},
              "inputs": inputs, "outputs": outputs, "gears": list(gears or []), "options": {}}
    container.write(path, header, payload)
    return str(path)


@pytest.fixture
def mlp_om(tmp_path, cpu_only):
    """(path of a dynamic-batch MLP CPU OM with gears 1,2,4, its ONNX model)."""
    model = mlp_onnx()
    return write_cpu_om(tmp_path / "mlp.om", model, [1, 2, 4]), model


@pytest.fixture
def static_om(tmp_path, cpu_only):
    model = mlp_onnx(batch=2)
    return write_cpu_om(tmp_path / "mlp_static.om", model, None), model


class LoadedModel:
    """A model loaded with load_from_file plus input/output datasets on device buffers."""

    def __init__(self, acl, path):
        self.acl = acl
        self.model_id, ret = acl.mdl.load_from_file(path)
        assert ret == 0
        self.desc = acl.mdl.create_desc()
        assert acl.mdl.get_desc(self.desc, self.model_id) == 0
        self.ptrs, self.buffers = [], []
        self.inputs = self._dataset(acl.mdl.get_num_inputs(self.desc), acl.mdl.get_input_size_by_index)
        self.outputs = self._dataset(acl.mdl.get_num_outputs(self.desc), acl.mdl.get_output_size_by_index)

    def _dataset(self, count, size_of):
        ds = self.acl.mdl.create_dataset()
        for i in range(count):
            size = size_of(self.desc, i)
            ptr, ret = self.acl.rt.malloc(size, C.ACL_MEM_MALLOC_NORMAL_ONLY)
            assert ret == 0
            buf = self.acl.create_data_buffer(ptr, size)
            _, ret = self.acl.mdl.add_dataset_buffer(ds, buf)
            assert ret == 0
            self.ptrs.append(ptr)
            self.buffers.append(buf)
        return ds

    def buffer_ptr(self, ds, index):
        return self.acl.get_data_buffer_addr(self.acl.mdl.get_dataset_buffer(ds, index))

    def write_input(self, index, array):
        data = np.ascontiguousarray(array).tobytes()
        ptr = self.buffer_ptr(self.inputs, index)
        size = self.acl.get_data_buffer_size_v2(self.acl.mdl.get_dataset_buffer(self.inputs, index))
        assert self.acl.rt.memcpy(ptr, size, self.acl.util.bytes_to_ptr(data), len(data),
                                  C.ACL_MEMCPY_HOST_TO_DEVICE) == 0

    def read_output(self, index, dtype, shape):
        count = int(np.prod(shape)) * np.dtype(dtype).itemsize
        host, ret = self.acl.rt.malloc_host(max(count, 1))
        assert ret == 0
        try:
            assert self.acl.rt.memcpy(host, count, self.buffer_ptr(self.outputs, index), count,
                                      C.ACL_MEMCPY_DEVICE_TO_HOST) == 0
            return np.frombuffer(self.acl.util.ptr_to_bytes(host, count), dtype).reshape(shape).copy()
        finally:
            self.acl.rt.free_host(host)

    def close(self, unload: bool = True):
        """Free what it made; and unload the model, unless the test did."""
        acl = self.acl
        for buf in self.buffers:
            assert acl.destroy_data_buffer(buf) == 0
        for ptr in self.ptrs:
            assert acl.rt.free(ptr) == 0
        assert acl.mdl.destroy_dataset(self.inputs) == 0
        assert acl.mdl.destroy_dataset(self.outputs) == 0
        assert acl.mdl.destroy_desc(self.desc) == 0
        if unload:
            assert acl.mdl.unload(self.model_id) == 0


@pytest.fixture
def loaded_mlp(acl, ctx, mlp_om):
    model = LoadedModel(acl, mlp_om[0])
    yield model
    model.close()
