"""Every tensor's dims must fit in the size the model reports (om_model.py checks it at load, per
row for a gear model): the slots lay the buffers out by the dims. A larger size (padding) loads.

An ATC OM whose static AIPP takes YUV420SP_U8 (which aclserve does not compile) reports the
picture's [N, H, W, C] with acl.mdl.get_input_dims and its YUV buffer, 1.5 x H x W bytes a row,
with get_input_size_by_index; only get_input_dims_v2 gives dims of that size ([N, 1.5H, W, 1],
CANN's aclmdlGetInputDimsV2). Read with get_input_dims, its load failed with a bare numpy reshape
error. The stand-in here is a real CPU OM compiled with an RGB888 AIPP whose header is edited to
say YUV420SP_U8: the CPU runtime then describes it as the device would (and refuses to execute it,
since its ONNX graph still takes RGB). Likewise a header that records a `size` other than its
dims' stands in for an OM whose runtime reports a size its dims do not give."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from aclserve.config import ImageInput
from aclserve.images import PlanError, build_plan
from aclserve.om import aipp, container
from aclserve.runtime import open_pool
from aclserve.runtime.device import LoadError
from aclserve.server.model_info import _input_format
from tests import REPO
from tests.tiny_models import compile_cpu_om, conv_onnx


def edited(source: str, path, edit) -> str:
    """A copy of the CPU OM `source` with its header changed by edit(header)."""
    om = container.decode(Path(source).read_bytes())
    edit(om.header)
    container.write(path, om.header, om.payload)
    return str(path)


def yuv420sp(header: dict) -> None:
    header["aipp"][0]["input_format"] = "YUV420SP_U8"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """x: uint8 pictures [N, 8, 8, 3] behind an RGB888 AIPP -> y FP32 [N, 4, 8, 8]; gears 1, 2 and static."""
    root = tmp_path_factory.mktemp("tensor_sizes")
    onnx_path = conv_onnx(root / "conv.onnx", side=8)
    gears = compile_cpu_om(onnx_path, root / "rgb.om", batch="1,2", aipp=[aipp.generate("rgb")])
    static = compile_cpu_om(onnx_path, root / "rgb_static.om", batch="2", aipp=[aipp.generate("rgb")])
    return {"rgb": gears, "rgb_static": static, "yuv": edited(gears, root / "yuv.om", yuv420sp)}


def test_a_yuv420sp_aipp_input_is_served_as_its_raw_buffer(runtime, models):
    pool = open_pool(runtime, models["yuv"], "m")
    try:
        spec = pool.inputs[0]
        assert (spec.shape, spec.datatype, spec.bytes_per_sample) == ((-1, 12, 8, 1), "UINT8", 96)
        assert (spec.raw_aipp_format, spec.aipp_color) == ("YUV420SP_U8", None)
        # what the runtime reports for it, as a device would: the shape is get_input_dims_v2's
        acl, desc = runtime.acl, pool.instances[0].model.desc
        assert acl.mdl.get_input_dims(desc, 0)[0]["dims"] == [-1, 8, 8, 3]
        assert acl.mdl.get_input_dims_v2(desc, 0)[0]["dims"] == [-1, 12, 8, 1]
        assert acl.mdl.get_input_size_by_index(desc, 0) == 2 * 96
        # images cannot feed it: its image settings are refused when the version loads, and its
        # Triton config names no picture layout (image_client would send a 12 x 8 grey picture)
        assert _input_format(spec, list(spec.sample_shape)) == "FORMAT_NONE"
        with pytest.raises(PlanError, match=r"image input 'x': its static AIPP takes YUV420SP_U8, which images "
                                            r"do not feed; clients send that buffer as UINT8 \[-1, 12, 8, 1\]"):
            build_plan(ImageInput(color="gray"), spec)
    finally:
        pool.close()


def test_a_model_of_a_picture_aipp_loads_as_before(runtime, models):
    for name, shape in (("rgb", (-1, 8, 8, 3)), ("rgb_static", (2, 8, 8, 3))):
        pool = open_pool(runtime, models[name], "m")
        try:
            assert [(s.shape, s.aipp_color, s.raw_aipp_format) for s in pool.inputs] == [(shape, "rgb", None)]
            assert build_plan(ImageInput(), pool.inputs[0]).color == "rgb"
        finally:
            pool.close()


def record_size(tensors: str, size: int):
    def edit(header: dict) -> None:
        header[tensors][0]["size"] = size
    return edit


@pytest.mark.parametrize("model, tensors, size, message", [
    # a gear model's output: 4 x 8 x 8 FP32 a row, at the largest gear (2)
    ("rgb", "outputs", 2000, "output 'y' has the dims [-1, 4, 8, 8] of FP32, 1,024 bytes a row, but the model "
                             "reports 1,000 bytes a row (2,000 at batch 2) for it"),
    # a static model's input reported smaller than its dims
    ("rgb_static", "inputs", 300, "input 'x' has the dims [2, 8, 8, 3] of UINT8, 384 bytes, but the model "
                                  "reports 300 bytes for it"),
    # the YUV420SP input reported at another size than its v2 dims give: the format is named
    ("yuv", "inputs", 180, "input 'x' (static AIPP of input format YUV420SP_U8) has the dims [-1, 12, 8, 1] of "
                           "UINT8, 96 bytes a row, but the model reports 90 bytes a row (180 at batch 2) for it"),
])
def test_a_size_its_dims_do_not_give_refuses_the_load_naming_both(runtime, models, tmp_path, model, tensors, size,
                                                                   message):
    om = edited(models[model], tmp_path / "m.om", record_size(tensors, size))
    ledger = runtime.device(0).ledger
    before = (ledger.streams, ledger.events, runtime.acl.memory_stats(0)["used"])
    with pytest.raises(LoadError) as refused:
        open_pool(runtime, om, "sized")
    assert re.fullmatch(r"model sized#\d+: " + re.escape(f"{message}: aclserve cannot lay out its buffer"),
                        str(refused.value)), refused.value
    assert (ledger.streams, ledger.events, runtime.acl.memory_stats(0)["used"]) == before  # nothing kept


@pytest.mark.parametrize("model, tensors, size", [("rgb", "outputs", 2 * 1024 + 64), ("rgb_static", "inputs", 800)])
def test_a_size_larger_than_its_dims_loads_and_serves(runtime, models, tmp_path, model, tensors, size):
    """A padded buffer (more bytes than the dims need) loaded before the check came and still does:
    rows are laid out by the dims; the CPU runtime binds its graph's bytes of it."""
    from aclserve.runtime.futures import BatchFutures

    plain = open_pool(runtime, models[model], "plain")
    padded = open_pool(runtime, edited(models[model], tmp_path / "m.om", record_size(tensors, size)), "padded")
    try:
        rows, gear = 2, (2 if plain.gears else None)
        picture = {"x": np.arange(rows * 8 * 8 * 3, dtype=np.uint8).reshape(rows, 8, 8, 3)}
        want = BatchFutures(plain).submit([picture], gear).result(60).outputs[0]["y"]
        got = BatchFutures(padded).submit([picture], gear).result(60).outputs[0]["y"]
        assert got.shape == (rows, 4, 8, 8) and np.array_equal(got, want)
    finally:
        plain.close()
        padded.close()


SCRIPT = r'''
import json, sys
from aclserve.runtime import AclRuntime, open_pool
from aclserve.runtime.device import LoadError
from aclserve.server.model_info import _input_format
out = {}
with AclRuntime("cpu") as runtime:
    out["has_v2"] = hasattr(runtime.acl.mdl, "get_input_dims_v2")
    for name, path in json.loads(sys.argv[1]).items():
        try:
            pool = open_pool(runtime, path, "m")
        except LoadError as e:
            out[name] = str(e)
        else:
            out[name] = [list(spec.shape) for spec in pool.inputs]
            pool.close()
print(json.dumps(out))
'''


def test_a_pyacl_without_get_input_dims_v2_reads_get_input_dims_and_refuses_a_yuv_input(models):
    """An older pyACL without get_input_dims_v2 (ACLSERVE_CPU_LACKS, in a process of its own): a
    picture AIPP loads as before; a YUV420SP one cannot be laid out, and the refusal says why."""
    env = {**os.environ, "ACLSERVE_CPU_LACKS": "mdl.get_input_dims_v2", "PYTHONPATH": REPO}
    paths = {name: models[name] for name in ("rgb", "yuv")}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(paths)], capture_output=True, text=True,
                          env=env, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["has_v2"] is False and out["rgb"] == [[-1, 8, 8, 3]]
    assert re.sub(r"^model m#\d+: ", "", out["yuv"]) == (
        "input 'x' (static AIPP of input format YUV420SP_U8) has the dims [-1, 8, 8, 3] of UINT8, "
        "192 bytes a row, but the model reports 96 bytes a row (192 at batch 2) for it: aclserve cannot lay out "
        "its buffer; this pyACL has no acl.mdl.get_input_dims_v2, which gives the dims of that format's buffer "
        "(with it, the input is served as its raw bytes)")


def test_the_cpu_runtime_does_not_execute_a_header_its_graph_does_not_match(runtime, models):
    """The edited OM's ONNX graph still takes RGB pictures of 192 bytes a row: executing it would
    read past the 96-byte buffers, so the CPU runtime refuses (a device runs it)."""
    from aclserve.errors import ExecutionFailed
    from aclserve.runtime.futures import BatchFutures

    pool = open_pool(runtime, models["yuv"], "m")
    try:
        future = BatchFutures(pool).submit([{"x": np.zeros((1, 12, 8, 1), np.uint8)}], 1)
        with pytest.raises(ExecutionFailed, match="145000"):
            future.result(60)
    finally:
        pool.close()
