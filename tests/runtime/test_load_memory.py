"""What loading a CPU OM costs in host memory: its weights are read once into the weight memory
and ONNX Runtime builds its session from there (acl/cpu/_weights.py): a 120 MB model's load peaks
at about 3.1 times its weights (the weight memory and ORT's own tensors and packed copies; a fixed
part of it weighs less in a bigger model), where it was 5 times (the file's bytes, their payload
slice, the weight memory, a copy for ORT and ORT's own copies of that). Measured in a
child process as its peak resident size (VmHWM: ru_maxrss would do, but a child forked from this
big test process inherits its figure across exec): a ratio of memory, not a time."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tests import REPO
from tests.tiny_models import compile_cpu_om, save_graph

WEIGHT_MB = 120

_CHILD = """
import sys
import onnxruntime  # (imported before the first figure: the import is no part of the model's cost)
from aclserve import Engine
def peak():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
with Engine(device="cpu") as engine:
    before = peak()
    model = engine.load(sys.argv[1], warmup=False)
    print(peak() - before)
"""


def _big_onnx(path) -> str:
    """x [N, 1000] through four MatMuls whose weights take WEIGHT_MB together."""
    k = WEIGHT_MB * 1_000_000 // 4 // 4 // 1000
    rng = np.random.default_rng(0)
    inits, nodes, prev = [], [], "x"
    for i in range(4):
        shape = (1000, k) if i % 2 == 0 else (k, 1000)
        inits.append(numpy_helper.from_array(rng.standard_normal(shape, dtype=np.float32) * 0.01, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}" if i < 3 else "y"]))
        prev = f"h{i}"
    graph = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1000])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1000])], inits)
    return save_graph(graph, path)


def test_a_load_peaks_under_four_times_the_weights(tmp_path):
    om = compile_cpu_om(_big_onnx(tmp_path / "big.onnx"), tmp_path / "big.om", batch="1,8")
    (tmp_path / "big.onnx").unlink()
    child = subprocess.run([sys.executable, "-c", _CHILD, om], capture_output=True, text=True, cwd=REPO,
                           timeout=300)
    assert child.returncode == 0, child.stderr
    growth = int(child.stdout.split()[-1])
    weights = WEIGHT_MB * 1_000_000
    assert growth < 4 * weights, f"the load's peak grew {growth / weights:.2f}x the weights"
