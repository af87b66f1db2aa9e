"""Tensor names longer than aclmdlIODims.name holds (127 bytes and its NUL): get_*_dims report
the stand-in acl_modelId_<model id>_<input|output>_<index>, and acl.mdl.get_tensor_real_name
maps it back, as hicann/ge model.cpp does (GetTensorDescNameToDims, aclmdlGetTensorRealName);
get_*_name_by_index and get_*_index_by_name know the real names only."""
from __future__ import annotations

import pytest
from onnx import TensorProto, helper

from aclserve.acl import constants as C
from .conftest import LoadedModel, write_cpu_om

LONG_IN = "input/" + "x" * 194  # 200 characters, as a torch export's names may run
LONG_OUT = "output/" + "y" * 193


def _graph(inputs: list[str], outputs: list[str], batch) -> helper.ModelProto:
    """Every output is Relu of the sum of the inputs ([batch, 2] FP32 each)."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Sum", inputs, ["total"])] + [helper.make_node("Relu", ["total"], [o]) for o in outputs]
    graph = helper.make_graph(nodes, "names", [vi(n, TensorProto.FLOAT, [batch, 2]) for n in inputs],
                              [vi(o, TensorProto.FLOAT, [batch, 2]) for o in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.fixture
def long_model(acl, ctx, tmp_path, cpu_only):
    path = write_cpu_om(tmp_path / "long.om", _graph([LONG_IN], [LONG_OUT, "short"], "batch"), [1, 2])
    model = LoadedModel(acl, path)
    yield model
    model.close(unload=False)
    assert acl.mdl.unload(model.model_id) in (0, C.ACL_ERROR_GE_EXEC_MODEL_ID_INVALID)  # (unless the test did)


def test_dims_report_a_name_over_127_bytes_under_its_stand_in(acl, long_model):
    desc, model_id = long_model.desc, long_model.model_id
    stand_in, out_stand_in = f"acl_modelId_{model_id}_input_0", f"acl_modelId_{model_id}_output_0"
    assert acl.mdl.get_input_name_by_index(desc, 0) == LONG_IN  # the name itself, whatever its length
    assert acl.mdl.get_output_name_by_index(desc, 0) == LONG_OUT
    assert acl.mdl.get_input_dims(desc, 0) == ({"name": stand_in, "dimCount": 2, "dims": [-1, 2]}, 0)
    assert acl.mdl.get_input_dims_v2(desc, 0) == ({"name": stand_in, "dimCount": 2, "dims": [-1, 2]}, 0)
    assert acl.mdl.get_output_dims(desc, 0) == ({"name": out_stand_in, "dimCount": 2, "dims": [2, 2]}, 0)
    assert acl.mdl.get_cur_output_dims(desc, 0) == ({"name": out_stand_in, "dimCount": 2, "dims": [2, 2]}, 0)
    assert acl.mdl.get_output_dims(desc, 1)[0]["name"] == "short"
    assert acl.mdl.get_input_dims(desc, 1)[0]["name"] == C.ACL_DYNAMIC_TENSOR_NAME
    # the index calls know the real name only (aclmdlGetIndexByName compares the desc's names)
    assert acl.mdl.get_input_index_by_name(desc, LONG_IN) == (0, 0)
    assert acl.mdl.get_input_index_by_name(desc, stand_in) == (0, C.ACL_ERROR_INVALID_PARAM)
    assert acl.mdl.get_output_index_by_name(desc, out_stand_in) == (0, C.ACL_ERROR_INVALID_PARAM)


def test_get_tensor_real_name_maps_a_stand_in_back(acl, long_model):
    desc, model_id = long_model.desc, long_model.model_id
    real = acl.mdl.get_tensor_real_name
    assert real(desc, f"acl_modelId_{model_id}_input_0") == LONG_IN
    assert real(desc, f"acl_modelId_{model_id}_output_0") == LONG_OUT
    assert real(desc, LONG_IN) == LONG_IN and real(desc, "short") == "short"  # a real name: itself
    # any name of the form with the desc's model id and an index in range: GE reads the parts alone
    # (split at "_", a sixth part unchecked, the numbers as strtoul reads them)
    assert real(desc, f"acl_modelId_{model_id}_output_1") == "short"
    assert real(desc, f"acl_modelId_{model_id}_input_1") == C.ACL_DYNAMIC_TENSOR_NAME
    assert real(desc, f"acl_modelId_{model_id}_input_0_zz") == LONG_IN
    assert real(desc, f"acl_modelId_{model_id}_input_0_") == LONG_IN
    assert real(desc, f"acl_modelId_000{model_id}_input_00") == LONG_IN
    for unknown in ("nope", "", f"acl_modelId_{model_id + 1}_input_0", f"acl_modelId_{model_id}_input_2",
                    f"acl_modelId_{model_id}_output_2", f"acl_modelId_{model_id}_inputs_0",
                    f"acl_modelId_{model_id}_input_0_a_b", f"acl_modelId_{model_id}_input_x",
                    f"acl_modelId_{model_id}_input_", f"acl_modelId_{model_id}_input_\u0663",  # (not an ASCII digit)
                    f"acl_modelId_{model_id}_input_{'9' * 5000}", f"ACL_modelId_{model_id}_input_0",
                    f"acl_modelid_{model_id}_input_0", f"acl_modelId_{model_id}_input_-0"):
        assert real(desc, unknown) is None, unknown  # (CANN's NULL, which pyACL returns as None)
    empty = acl.mdl.create_desc()  # a desc get_desc never filled holds no names
    assert real(empty, f"acl_modelId_{model_id}_input_0") is None and real(0, LONG_IN) is None
    assert acl.mdl.destroy_desc(empty) == 0
    with pytest.raises(TypeError, match="acl.mdl.get_tensor_real_name args parse failed"):
        real(desc, None)
    with pytest.raises(TypeError, match="acl.mdl.get_tensor_real_name args parse failed"):
        real(desc)


def test_the_desc_keeps_its_names_after_unload(acl, long_model):
    """aclmdlDesc holds its own copy of the names and the model id: read after unload alike."""
    desc, model_id = long_model.desc, long_model.model_id
    assert acl.mdl.unload(model_id) == 0
    assert acl.mdl.get_input_dims(desc, 0)[0]["name"] == f"acl_modelId_{model_id}_input_0"
    assert acl.mdl.get_tensor_real_name(desc, f"acl_modelId_{model_id}_output_0") == LONG_OUT


def test_the_limit_counts_utf8_bytes(acl, ctx, tmp_path, cpu_only):
    """The name is copied as C bytes (UTF-8): 64 two-byte characters do not fit, 127 bytes do."""
    names = ["a" * 127, "b" * 128, "\u00e9" * 64, "\u00e9" * 63 + "e"]
    model = LoadedModel(acl, write_cpu_om(tmp_path / "bytes.om", _graph(names, ["y"], 1), None))
    try:
        reported = [acl.mdl.get_input_dims(model.desc, i)[0]["name"] for i in range(4)]
        stand_in = f"acl_modelId_{model.model_id}_input_"
        assert reported == [names[0], stand_in + "1", stand_in + "2", names[3]]
        assert [acl.mdl.get_tensor_real_name(model.desc, n) for n in reported] == names
    finally:
        model.close()


def test_a_stand_in_that_a_tensor_holds_takes_a_letter(acl, ctx, tmp_path, cpu_only):
    """A stand-in that is some tensor's real name takes "_a", "_b", ... (GE's
    TransConvertTensorNameToLegal); get_tensor_real_name gives a real name first."""
    probe = LoadedModel(acl, write_cpu_om(tmp_path / "probe.om", _graph(["x"], ["y"], 1), None))
    probe.close()
    model_id = probe.model_id + 1  # (the CPU runtime counts model ids up, one a load)
    taken = [f"acl_modelId_{model_id}_input_0", f"acl_modelId_{model_id}_input_0_a"]
    model = LoadedModel(acl, write_cpu_om(tmp_path / "clash.om", _graph([LONG_IN], taken, 1), None))
    try:
        assert model.model_id == model_id
        assert acl.mdl.get_input_dims(model.desc, 0)[0]["name"] == f"acl_modelId_{model_id}_input_0_b"
        assert acl.mdl.get_tensor_real_name(model.desc, f"acl_modelId_{model_id}_input_0_b") == LONG_IN
        assert acl.mdl.get_tensor_real_name(model.desc, taken[0]) == taken[0]  # the output so named
        assert acl.mdl.get_output_dims(model.desc, 1)[0]["name"] == taken[1]  # (short: its own)
    finally:
        model.close()
