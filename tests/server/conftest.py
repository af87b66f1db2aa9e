"""A real server on a real port: real repository, real CPU runtime, real CPU OMs built from
tiny ONNX models. The server runs its own event loop in a background thread, so tests can use
blocking clients (tritonclient) directly and aiohttp clients under asyncio.run()."""
from __future__ import annotations

import asyncio
import socket
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(11)
W = RNG.standard_normal((8, 4)).astype(np.float32)
B = RNG.standard_normal((4,)).astype(np.float32)


def _save(graph, path) -> str:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


def affine_onnx(path) -> str:
    """y = x @ W + b (FP32 [N,8] -> [N,4]); s = idx * 2 (INT64 [N,3] -> [N,3])."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
    idx = helper.make_tensor_value_info("idx", TensorProto.INT64, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    s = helper.make_tensor_value_info("s", TensorProto.INT64, ["batch", 3])
    inits = [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B"),
             numpy_helper.from_array(np.array(2, np.int64), "two")]
    nodes = [helper.make_node("Gemm", ["x", "W", "B"], ["y"]), helper.make_node("Mul", ["idx", "two"], ["s"])]
    return _save(helper.make_graph(nodes, "affine", [x, idx], [y, s], inits), path)


def double_onnx(path) -> str:
    """y = 2 * x (FP32 [N,16] -> [N,16]): a single-input model for raw binary requests."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])
    inits = [numpy_helper.from_array(np.array(2, np.float32), "two")]
    nodes = [helper.make_node("Mul", ["x", "two"], ["y"])]
    return _save(helper.make_graph(nodes, "double", [x], [y], inits), path)


def affine_reference(x, idx):
    return {"y": x @ W + B, "s": idx * 2}


def build_om(onnx_path, om_path, batch="1,2,4,8") -> str:
    from aclserve.om.compile import compile_model
    return str(compile_model(onnx_path, om_path, batch=batch, target="cpu", log=lambda _: None).path)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for the gRPC endpoint, where 0 means off)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_config(models_dir, **overrides):
    from aclserve.config import load_server_config
    values = {"models_dir": str(models_dir), "port": 0, "grpc_port": 0, "device": "cpu",
              "model_control_mode": "explicit", "max_body_bytes": 1 << 20, "max_json_bytes": 768 << 10,
              "max_json_elements": 1 << 18, "shutdown_timeout_s": 20, "log_level": "warning"}
    values.update(overrides)
    return load_server_config(None, values)


class ServerThread:
    """Runs aclserve.app.serve() (what `aclserve serve` runs) on its own loop in a thread; close()
    stops it in order."""

    def __init__(self, config, run=asyncio.run):
        """`run` runs the server's coroutine to completion (asyncio.run, or uvloop.run as
        `aclserve serve` does where uvloop is installed)."""
        self.config = config
        self.url = ""
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=run, args=(self._main(),), daemon=True)

    async def _main(self):
        from aclserve.app import serve
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        started = self._loop.create_future()
        task = asyncio.create_task(serve(self.config, started=started, stop=self._stop))
        done, _ = await asyncio.wait([task, started], return_when=asyncio.FIRST_COMPLETED)
        if started.done():
            host, port = started.result()
            self.url = f"{host}:{port}"
            self._ready.set()
        try:
            await task
        except BaseException as e:
            self.error = e
        finally:
            self._ready.set()

    def start(self) -> "ServerThread":
        self._thread.start()
        self._ready.wait(120)
        if not self.url:
            raise RuntimeError(f"server did not start: {self.error!r}")
        return self

    def close(self) -> None:
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)


@pytest.fixture(scope="session")
def make_config():
    return server_config


@pytest.fixture(scope="session")
def reference():
    return affine_reference


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("server_models")
    src = tmp_path_factory.mktemp("server_src")
    build_om(affine_onnx(src / "affine.onnx"), root / "affine.om")
    build_om(double_onnx(src / "double.onnx"), root / "double.om")
    return root


@pytest.fixture(scope="module")
def server(models_dir):
    srv = ServerThread(server_config(models_dir)).start()
    yield srv
    srv.close()
    if srv.error is not None:
        raise srv.error
