"""The interpreter's exit with an Engine left open, each in a process of its own: calls still in
flight let it exit cleanly, and a load that hangs does not hold it."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.tiny_models import compile_cpu_om, save_graph

pytestmark = pytest.mark.usefixtures("clean_faults")


EXIT_WITH_CALLS_IN_FLIGHT = """
import sys
import numpy as np
import aclserve
engine = aclserve.Engine(device="cpu")
model = engine.load(sys.argv[1])
x = np.ones((64, 1024), np.float32)
model.infer({"x": x})
calls = [model.submit({"x": x}) for _ in range(6)]
print("leaving", flush=True)
"""


def test_an_engine_left_open_with_calls_in_flight_lets_the_process_exit_cleanly(tmp_path):
    """ONNX Runtime runs still going in daemon threads met the interpreter's end: SIGABRT
    ('terminate called without an active exception') or SIGSEGV in 3 of 5 exits (found by a
    helper's misuse of the Python API). Engines left open are closed at exit."""
    import subprocess
    import sys
    from onnx import numpy_helper
    from tests import REPO
    weight = numpy_helper.from_array(np.full((1024, 1024), 1e-3, np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x" if k == 0 else f"h{k}", "w"], [f"h{k + 1}" if k < 29 else "y"])
             for k in range(30)]  # about 0.2 s a run of 64 rows
    graph = helper.make_graph(nodes, "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1024])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1024])], [weight])
    om = compile_cpu_om(save_graph(graph, tmp_path / "slow.onnx"), tmp_path / "slow.om", batch="64")
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", EXIT_WITH_CALLS_IN_FLIGHT, om], cwd=REPO, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0 and "leaving" in proc.stdout, (proc.returncode, proc.stderr[-2000:])
        assert "terminate called" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]


EXIT_WHILE_A_LOAD_HANGS = """
import sys, threading, time
import aclserve
from aclserve.acl.cpu import faults
from aclserve.runtime import engine as engine_module
engine_module.EXIT_LOAD_WAIT_S = 0.5
engine = aclserve.Engine(device="cpu")
faults.inject("load", nth=1, delay_ms=600_000)
threading.Thread(target=engine.load, args=(sys.argv[1],), daemon=True).start()
time.sleep(0.5)
print("leaving", flush=True)
"""


def test_an_engine_whose_load_hangs_at_exit_does_not_hold_the_exit(affine_om):
    """Closing open engines at exit waited for their loads under way: a hung load held the
    process for good (found by a review)."""
    import subprocess
    import sys
    from tests import REPO
    proc = subprocess.run([sys.executable, "-c", EXIT_WHILE_A_LOAD_HANGS, affine_om()], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "leaving" in proc.stdout, proc.stderr[-2000:]
    assert "its runtime is not" in proc.stderr, proc.stderr[-2000:]
