"""A model whose largest batch's request does not fit in one gRPC message (grpc_max_message_bytes)
is said in a WARNING line as it loads with gRPC on (server/grpc_message_fit.py): grpc refuses such
a request itself, RESOURCE_EXHAUSTED, and nothing counted it (a tester). A real server on real
ports, a real [N, 65536] FP32 model compiled for 32 rows, and tritonclient.grpc."""
from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest
import tritonclient.grpc
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from tests.serving import ServerThread, free_port, server_config
from tests.tiny_models import compile_cpu_om, save_graph

MiB = 1 << 20
WIDTH = 65536  # 256 KiB of FP32 a row: 32 rows are 8 MiB, and the message's framing more
LOGGER = "aclserve.server.grpc_message_fit"


@pytest.fixture(scope="module")
def models(models_dir, tmp_path_factory):
    """wide.om (y = 2 x, FP32 [N, 65536], batch sizes 1 and 32) and affine.om, which fits."""
    root = tmp_path_factory.mktemp("message_fit")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"])], "wide", [x], [y],
                              [numpy_helper.from_array(np.array(2, np.float32), "two")])
    compile_cpu_om(save_graph(graph, root / "wide.onnx"), root / "wide.om", batch="1,32")
    (root / "wide.onnx").unlink()
    shutil.copy(models_dir / "affine.om", root / "affine.om")
    return root


def config(models, grpc: bool):
    return server_config(models, grpc_port=free_port() if grpc else 0, max_body_bytes=16 * MiB,
                         grpc_max_message_bytes=8 * MiB)


def said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def test_a_model_whose_largest_batch_grpc_refuses_is_said_once_with_the_rows_that_fit(models, caplog):
    caplog.set_level(logging.WARNING, LOGGER)
    with ServerThread(config(models, grpc=True)) as srv:
        client = tritonclient.grpc.InferenceServerClient(f"127.0.0.1:{srv.config.grpc_port}")
        lines = said(caplog)
        assert len(lines) == 1 and lines[0].startswith(
            "wide: version 1: gRPC requests of it fit in one message up to 31 rows, not its max_batch_size of 32: "
            "32 rows take 8,388,"), lines
        assert "over grpc_max_message_bytes (8,388,608)" in lines[0] and "raise grpc_max_message_bytes" in lines[0]

        def infer(rows: int):
            tensor = tritonclient.grpc.InferInput("x", [rows, WIDTH], "FP32")
            tensor.set_data_from_numpy(np.ones((rows, WIDTH), np.float32))
            return client.infer("wide", [tensor])
        assert infer(31).as_numpy("y").shape == (31, WIDTH)  # the rows said to fit do
        with pytest.raises(InferenceServerException) as refused:
            infer(32)
        assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        (models / "wide.yaml").write_text("batching: {max_queue_delay_ms: 1}\n")
        try:
            client.load_model("wide")  # reloaded (its config changed): not said again
        finally:
            (models / "wide.yaml").unlink()
        assert client.get_model_config("wide").config.dynamic_batching.max_queue_delay_microseconds == 1000
        assert said(caplog) == lines


def test_nothing_is_said_with_grpc_off(models, caplog):
    caplog.set_level(logging.WARNING, LOGGER)
    with ServerThread(config(models, grpc=False)):
        pass
    assert said(caplog) == []
