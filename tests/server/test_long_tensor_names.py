"""A model whose tensor names run past the 127 bytes aclmdlIODims.name holds (a torch export's
200-character names; an ATC output name `<node>:<index>:<tensor>` twice that): served under the
names clients know, which aclserve reads with get_*_name_by_index, never from the dims, whose name
the device (and the CPU runtime) gives as a stand-in (acl_modelId_<id>_input_0); and `aclserve
inspect` says which name each call reports."""
import os

import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from aclserve.om.describe import describe, format_text
from tests.serving import ServerThread, server_config
from tests.tiny_models import compile_cpu_om, save_graph

LONG_IN = "input." + "x" * 194
LONG_OUT = "output." + "y" * 193
LONG_NODE = "/model/encoder/" + "n" * 185


@pytest.fixture(scope="module")
def long_om(tmp_path_factory):
    src, models = tmp_path_factory.mktemp("long_src"), tmp_path_factory.mktemp("long_models")
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Relu", [LONG_IN], [LONG_OUT], name=LONG_NODE),
                               helper.make_node("Neg", [LONG_IN], ["short"], name="neg")], "long",
                              [vi(LONG_IN, TensorProto.FLOAT, ["n", 2])],
                              [vi(LONG_OUT, TensorProto.FLOAT, ["n", 2]), vi("short", TensorProto.FLOAT, ["n", 2])])
    save_graph(graph, src / "long.onnx")
    return compile_cpu_om(src / "long.onnx", models / "long.om", "1,2")


@pytest.fixture(scope="module")
def server(long_om):
    with ServerThread(server_config(os.path.dirname(long_om), model_control_mode="none")) as server:
        yield server


@pytest.mark.parametrize("binary", [True, False])
def test_long_names_are_served_as_the_onnx_model_has_them(server, binary):
    client = httpclient.InferenceServerClient(server.url)
    try:
        meta = client.get_model_metadata("long")
        assert [t["name"] for t in meta["inputs"]] == [LONG_IN]
        assert sorted(t["name"] for t in meta["outputs"]) == sorted([LONG_OUT, "short"])
        x = np.array([[1, -2], [-3, 4]], np.float32)
        given = httpclient.InferInput(LONG_IN, [2, 2], "FP32")
        given.set_data_from_numpy(x, binary_data=binary)
        wanted = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in (LONG_OUT, "short")]
        answer = client.infer("long", [given], outputs=wanted)
        np.testing.assert_array_equal(answer.as_numpy(LONG_OUT), np.maximum(x, 0))
        np.testing.assert_array_equal(answer.as_numpy("short"), -x)
    finally:
        client.close()


def test_inspect_says_which_name_each_call_reports(long_om):
    lines = format_text(describe(long_om)).splitlines()
    [long_in] = [line for line in lines if line.startswith(f"  {LONG_IN}:")]
    [long_out] = [line for line in lines if line.startswith(f"  {LONG_OUT}:")]
    [short] = [line for line in lines if line.startswith("  short:")]
    assert long_in.endswith("(the device reports acl_modelId_<model id>_input_0 in get_input_dims, "
                            "the name being over 127 bytes)")
    assert long_out.endswith(f"(the device reports {LONG_NODE}:0:{LONG_OUT} by name, and "
                             "acl_modelId_<model id>_output_0 in get_output_dims, the name being over 127 bytes)")
    assert short.endswith("(the device reports neg:0:short)")  # (14 bytes: the dims report it too)
