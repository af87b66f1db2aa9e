"""Engine.load (found by an independent check of the Python API): a load whose warm-up fails
leaves nothing running, the warm-up measures the execution timeout as the server's does (with
warmup_data 'ones' for a model zeros cannot run), and an .onnx given to it is told how to become
an OM."""
from __future__ import annotations

import re
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper

from aclserve.acl.cpu import faults
from aclserve.errors import ExecutionFailed
from aclserve.runtime import Engine
from aclserve.runtime.execution_timeout import UNMEASURED_TIMEOUT_MS

from tests.tiny_models import compile_cpu_om, save_graph

pytestmark = pytest.mark.usefixtures("clean_faults")


def test_a_load_whose_warm_up_fails_leaves_no_instance_running(affine_om):
    """The pool was neither closed nor kept: its threads ran on, and a rebuild brought the
    instance back after the engine's close."""
    before = {t.ident for t in threading.enumerate()}
    with Engine(device="cpu") as engine:
        faults.inject("execute", nth=1)
        with pytest.raises(ExecutionFailed):
            engine.load(affine_om(), retry=False)
        faults.clear()
        assert engine.models == []
    left = [t.name for t in threading.enumerate() if t.ident not in before and t.name != "aclserve-abandoned-retry"]
    assert left == []


def test_warm_up_sets_the_execution_timeout_as_the_server_does(affine_om):
    with Engine(device="cpu") as engine:
        assert engine.load(affine_om()).pool.execution_timeout_ms < UNMEASURED_TIMEOUT_MS
        assert engine.load(affine_om(), warmup=False).pool.execution_timeout_ms == UNMEASURED_TIMEOUT_MS


def test_a_model_that_cannot_run_on_zeros_loads_with_warmup_data_ones(tmp_path):
    """The server's `warmup_data: ones`: the Engine had only warmup=False, which also leaves the
    execution timeout unmeasured."""
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Div", ["a", "b"], ["y"])], "idiv",
                              [vi("a", TensorProto.INT64, ["n", 2]), vi("b", TensorProto.INT64, ["n", 2])],
                              [vi("y", TensorProto.INT64, ["n", 2])])
    save_graph(graph, tmp_path / "idiv.onnx")
    compile_cpu_om(tmp_path / "idiv.onnx", tmp_path / "idiv.om", "1,2")
    with Engine(device="cpu") as engine:
        with pytest.raises(ExecutionFailed, match=r"load it with warmup_data='ones' or warmup=False\)"):
            engine.load(tmp_path / "idiv.om")
        model = engine.load(tmp_path / "idiv.om", warmup_data="ones")
        assert model.pool.execution_timeout_ms < UNMEASURED_TIMEOUT_MS
        assert model.infer({"a": np.array([[7, 9]]), "b": np.array([[2, 3]])})["y"].tolist() == [[3, 3]]


def test_loading_an_onnx_model_says_to_compile_it(tmp_path):
    """Engine.load takes OMs; an .onnx was refused as "not an OM file" with no word of what to
    do, where `aclserve inspect` says it (found by a helper). It says it is no OM once, as the
    repository's index and `aclserve inspect` do: "is not a loadable OM: not an OM file (...)" before (i230)."""
    from aclserve.runtime import LoadError
    from tests.tiny_models import affine_onnx
    src = affine_onnx(tmp_path / "affine.onnx")
    with Engine(device="cpu") as engine:
        with pytest.raises(LoadError, match=r"affine\.onnx is not an OM file \(neither a CPU OM nor an ATC 'IMOD' "
                                            r"header\) \(an ONNX model: "
                                            rf"`aclserve compile {re.escape(src)}` makes an OM of it\)"):
            engine.load(src)
