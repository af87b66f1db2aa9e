"""One request ended the whole server: a = [-2147483648, 4], b = [-1, 2] to a model y = Div(a, b)
of INT32 (a tester's): ONNX Runtime's Div divides with x86's idiv, which traps on INT_MIN / -1,
and the process died of SIGFPE (exit 136), no log line, every model and request gone. The CPU
runtime now rewrites such divisions as its sessions are made (acl/cpu/_safe_division.py): the
answer is the wrapped value, INT_MIN, and the server serves on. The OMs here are compiled as any
other (their graphs hold plain Div and Mod nodes, as OMs compiled before the change do).

The server runs in a process of its own (`aclserve serve`): without the change a request here
kills it, and the test fails on the dead server rather than taking pytest's process with it. (The
Mod tests pass without it on ONNX Runtime 1.32.0, whose Mod answers INT_MIN % -1; on 1.31.1 and
older they kill the server too.)"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from aclserve.om.compile import compile_model

from tests import REPO
from tests.processes import leashed_popen
from tests.tiny_models import compile_cpu_om, save_graph

INT32_MIN, INT64_MIN = int(np.iinfo(np.int32).min), int(np.iinfo(np.int64).min)
TYPES = {"INT32": TensorProto.INT32, "INT64": TensorProto.INT64}
TABLE = np.array([-1, 3] + [7] * 20_000, np.int64)  # 160 KB: a divisor table the session gets as a view


def _division_onnx(path, op: str, datatype: str, **attrs) -> str:
    """y = op(a, b), a and b of `datatype`, [batch, 2]."""
    vi = helper.make_tensor_value_info
    inputs = [vi(name, TYPES[datatype], ["batch", 2]) for name in ("a", "b")]
    return save_graph(helper.make_graph([helper.make_node(op, ["a", "b"], ["y"], **attrs)], op.lower(), inputs,
                                        [vi("y", TYPES[datatype], ["batch", 2])]), path)


def _table_onnx(path) -> str:
    """y = Div(a, TABLE[i]) (INT64 [batch, 2]): the divisor from a large initializer."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Gather", ["table", "i"], ["d"]), helper.make_node("Div", ["a", "d"], ["y"])]
    return save_graph(helper.make_graph(nodes, "table", [vi("a", TensorProto.INT64, ["batch", 2]),
                                                         vi("i", TensorProto.INT64, ["batch", 2])],
                                        [vi("y", TensorProto.INT64, ["batch", 2])],
                                        [numpy_helper.from_array(TABLE, "table")]), path)


def _branch_onnx(path) -> str:
    """y = If(divide[0]) Div(a, b) else Mod(a, b) (INT32 [1, 2], static): the divisions in subgraphs."""
    vi = helper.make_tensor_value_info
    then = helper.make_graph([helper.make_node("Div", ["a", "b"], ["q"])], "then", [],
                             [vi("q", TensorProto.INT32, None)])
    orelse = helper.make_graph([helper.make_node("Mod", ["a", "b"], ["r"])], "else", [],
                               [vi("r", TensorProto.INT32, None)])
    nodes = [helper.make_node("If", ["divide"], ["y"], then_branch=then, else_branch=orelse)]
    return save_graph(helper.make_graph(nodes, "branch", [vi("a", TensorProto.INT32, [1, 2]),
                                                          vi("b", TensorProto.INT32, [1, 2]),
                                                          vi("divide", TensorProto.BOOL, [1])],
                                        [vi("y", TensorProto.INT32, [1, 2])]), path)


class Server:
    """`aclserve serve` in a process of its own, on a port the kernel picks, its log in a file."""

    def __init__(self, models, log_path):
        self.log_path = log_path
        self._log = open(log_path, "w")
        env = {k: v for k, v in os.environ.items() if k != "ACLSERVE_CPU_FAULTS"}
        self.proc = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--port", "0", "--grpc-port", "0",
                                   "--device", "cpu", "--models", str(models), "--log-level", "info"],
                                  stdout=self._log, stderr=subprocess.STDOUT, env=dict(env, PYTHONPATH=str(REPO)))
        self.port = None
        for _ in range(1200):  # a hang guard: until it serves its models, or has ended
            found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", self.log())
            self.port = self.port or (found and int(found.group(1)))
            if self.proc.poll() is not None or self.port and self._ready():
                break
            time.sleep(0.1)
        assert self.proc.poll() is None and self.port, self.log()[-3000:]

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def _ready(self) -> bool:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v2/health/ready", timeout=5).status == 200
        except OSError:
            return False

    def infer(self, model: str, datatype: str, **inputs) -> tuple[int, dict]:
        """(status, answer) of one JSON request; the server must live on after it."""
        tensors = [{"name": name, "datatype": "BOOL" if isinstance(values[0], bool) else datatype,
                    "shape": [len(values) // 2, 2] if name != "divide" else [1], "data": values}
                   for name, values in inputs.items()]
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/v2/models/{model}/infer",
                                         data=json.dumps({"inputs": tensors}).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as resp:
                answer = resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            answer = e.code, json.loads(e.read())
        except OSError as e:  # (the server gone mid-request, or gone before it)
            answer = None, {"error": repr(e)}
            try:
                self.proc.wait(timeout=30)  # (a hang guard: the exit of a dying server, for the message)
            except subprocess.TimeoutExpired:
                pass
        assert self.proc.poll() is None, (f"the server ended (exit {self.proc.returncode}) on a {model} request: "
                                          f"{self.log()[-2000:]}")
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    src, folder = tmp_path_factory.mktemp("division_src"), tmp_path_factory.mktemp("division_models")
    built = {f"{op.lower()}{bits}": _division_onnx(src / f"{op}{bits}.onnx", op, f"INT{bits}")
             for op in ("Div", "Mod") for bits in (32, 64)}
    built["table"] = _table_onnx(src / "table.onnx")
    for name, path in built.items():
        compile_cpu_om(path, folder / f"{name}.om", batch="1,2")
    compile_model(_branch_onnx(src / "branch.onnx"), folder / "branch.om", target="cpu", log=lambda _: None)
    for name in (*built, "branch"):
        (folder / f"{name}.yaml").write_text("warmup_data: ones\n")  # (zeros: a division by zero)
    return folder


@pytest.fixture(scope="module")
def server_of_module(models, tmp_path_factory):
    """A function giving the module's server, started again where a test before ended it: without
    the change each test fails on its own, not on the server the first one killed."""
    servers: list[Server] = []

    def current() -> Server:
        if not servers or servers[-1].proc.poll() is not None:
            servers.append(Server(models, tmp_path_factory.mktemp("division_log") / "serve.log"))
        return servers[-1]
    yield current
    for srv in servers:
        srv.close()


@pytest.fixture
def server(server_of_module):
    return server_of_module()


@pytest.mark.parametrize("bits,minimum", [(32, INT32_MIN), (64, INT64_MIN)])
def test_the_minimum_divided_by_minus_one_wraps_and_the_server_serves_on(server, bits, minimum):
    status, answer = server.infer(f"div{bits}", f"INT{bits}", a=[minimum, 4], b=[-1, 2])
    assert status == 200, answer
    assert answer["outputs"][0]["data"] == [minimum, 2]  # (two's complement: -INT_MIN wraps to INT_MIN)
    status, answer = server.infer(f"div{bits}", f"INT{bits}", a=[7, -7, minimum + 1, 9], b=[2, -1, -1, -4])
    assert status == 200, answer
    assert answer["outputs"][0]["data"] == [3, 7, -(minimum + 1), -2]  # (truncated toward zero, as ORT's)


@pytest.mark.parametrize("bits,minimum", [(32, INT32_MIN), (64, INT64_MIN)])
def test_the_minimum_modulo_minus_one_is_zero(server, bits, minimum):
    status, answer = server.infer(f"mod{bits}", f"INT{bits}", a=[minimum, -7, 7, minimum], b=[-1, 3, -1, 3])
    assert status == 200, answer
    assert answer["outputs"][0]["data"] == [0, 2, 0, 1]  # (fmod=0: the sign of the divisor, as numpy's %)


def test_a_divisor_from_a_large_initializer(server):
    """The table's bytes reach the session as a view of the weight memory (acl/cpu/_weights.py)."""
    status, answer = server.infer("table", "INT64", a=[INT64_MIN, 10], i=[0, 1])
    assert status == 200, answer
    assert answer["outputs"][0]["data"] == [INT64_MIN, 3]


def test_divisions_inside_if_branches(server):
    status, answer = server.infer("branch", "INT32", a=[INT32_MIN, 9], b=[-1, 4], divide=[True])
    assert status == 200 and answer["outputs"][0]["data"] == [INT32_MIN, 2], answer
    status, answer = server.infer("branch", "INT32", a=[INT32_MIN, 9], b=[-1, 4], divide=[False])
    assert status == 200 and answer["outputs"][0]["data"] == [0, 1], answer


@pytest.mark.parametrize("model,op,said,after", [("div32", "Div", "Integer division by zero", [4, 2]),
                                                  ("mod64", "Mod", "Integer modulo by zero", [1, 2])])
def test_a_division_by_zero_still_fails_its_run_as_before(server, model, op, said, after):
    """ONNX Runtime's own failed run (from 1.25.0 on): the batch fails as a device fault (500),
    its instance is rebuilt, and the next request is served."""
    datatype = "INT32" if model.endswith("32") else "INT64"
    status, answer = server.infer(model, datatype, a=[1, 2], b=[0, 1])
    assert status == 500 and "failed on device" in answer["error"], answer
    assert f"running {op} node" in server.log() and said in server.log(), server.log()[-3000:]
    for _ in range(300):  # a hang guard: the rebuilt instance serves (a request meanwhile may find none)
        status, answer = server.infer(model, datatype, a=[9, 8], b=[2, 3])
        if status == 200:
            break
        time.sleep(0.1)
    assert status == 200 and answer["outputs"][0]["data"] == after, answer
