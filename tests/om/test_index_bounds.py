"""Which integer inputs index a table of the model, read from the ONNX graph (om/index_bounds.py)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from aclserve.om.index_bounds import index_bounds


def graph(nodes, inputs, tables=(), constants=()):
    """`inputs`: (name, elem type); `tables`: (name, shape) initializers; `constants`: (name,
    shape) made by Constant nodes."""
    made = [helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.zeros(shape, np.float32)))
            for name, shape in constants]
    return helper.make_graph(made + nodes, "g", [helper.make_tensor_value_info(n, t, None) for n, t in inputs],
                             [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
                             [numpy_helper.from_array(np.zeros(shape, np.float32), name) for name, shape in tables])


def gather(data, indices, out="out", **attrs):
    return helper.make_node("Gather", [data, indices], [out], **attrs)


def test_the_table_size_along_the_gathers_axis_bounds_the_input():
    assert index_bounds(graph([gather("t", "ids")], [("ids", TensorProto.INT64)], [("t", (100, 4))])) == {"ids": 100}
    assert index_bounds(graph([gather("t", "ids", axis=1)], [("ids", TensorProto.INT32)], [("t", (3, 7))])) == {"ids": 7}
    assert index_bounds(graph([gather("t", "ids", axis=-1)], [("ids", TensorProto.UINT8)], [("t", (3, 9))])) == {"ids": 9}
    assert index_bounds(graph([gather("c", "ids")], [("ids", TensorProto.INT64)], constants=[("c", (12, 2))])) == {"ids": 12}


def test_the_smallest_of_several_tables_bounds_it():
    nodes = [gather("big", "ids", "a"), gather("small", "ids", "b"), helper.make_node("Add", ["a", "b"], ["out"])]
    assert index_bounds(graph(nodes, [("ids", TensorProto.INT64)], [("big", (100, 2)), ("small", (30, 2))])) == {"ids": 30}


def test_the_values_are_followed_through_ops_that_keep_them():
    nodes = [helper.make_node("Cast", ["ids"], ["c"], to=TensorProto.INT32),
             helper.make_node("Reshape", ["c", "shape"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("Identity", ["f"], ["i"]), gather("t", "i")]
    g = graph(nodes, [("ids", TensorProto.INT64)], [("t", (64, 8))])
    g.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), "shape"))
    assert index_bounds(g) == {"ids": 64}
    widen = [helper.make_node("Cast", ["ids"], ["c"], to=TensorProto.INT16), gather("t", "c")]
    assert index_bounds(graph(widen, [("ids", TensorProto.UINT8)], [("t", (64, 8))])) == {"ids": 64}


@pytest.mark.parametrize("source, target, table, bound", [
    (TensorProto.INT64, TensorProto.INT32, 256, 256),  # the usual export: a second review found it unchecked
    (TensorProto.INT32, TensorProto.UINT8, 256, 256),  # 300 would wrap to a valid 44: refused all the same
    (TensorProto.INT8, TensorProto.UINT8, 256, 256),  # -1 would become 255: negative, refused
    (TensorProto.UINT64, TensorProto.INT64, 256, 256),
    (TensorProto.INT64, TensorProto.INT8, 200, 128),  # 128..199 wrap to negative indices: not the rows asked
])
def test_through_a_narrowing_cast_the_bound_is_what_the_cast_keeps(source, target, table, bound):
    nodes = [helper.make_node("Cast", ["ids"], ["c"], to=target),
             helper.make_node("Cast", ["c"], ["w"], to=TensorProto.INT64), gather("t", "w")]
    assert index_bounds(graph(nodes, [("ids", source)], [("t", (table, 2))])) == {"ids": bound}


def test_inputs_that_do_not_index_a_constant_table_have_no_bound():
    # through a cast to a float and back: the values may have changed
    nodes = [helper.make_node("Cast", ["ids"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["f"], ["i"], to=TensorProto.INT64), gather("t", "i")]
    assert index_bounds(graph(nodes, [("ids", TensorProto.INT64)], [("t", (10, 2))])) == {}
    # a table computed by the graph, the input as the gathered data, a float input, an offset
    nodes = [helper.make_node("Relu", ["t"], ["u"]), gather("u", "ids")]
    assert index_bounds(graph(nodes, [("ids", TensorProto.INT64)], [("t", (10, 2))])) == {}
    assert index_bounds(graph([gather("ids", "k")], [("ids", TensorProto.INT64), ("k", TensorProto.FLOAT)])) == {}
    nodes = [helper.make_node("Add", ["ids", "ids"], ["s"]), gather("t", "s")]
    assert index_bounds(graph(nodes, [("ids", TensorProto.INT64)], [("t", (10, 2))])) == {}


def test_an_initializer_listed_among_the_inputs_is_not_an_input():
    g = graph([gather("t", "ids")], [("ids", TensorProto.INT64)], [("t", (5, 2))])
    g.initializer.append(numpy_helper.from_array(np.array([1, 2], np.int64), "w"))
    g.input.append(helper.make_tensor_value_info("w", TensorProto.INT64, [2]))
    g.node.append(gather("t", "w", "out2"))
    assert index_bounds(g) == {"ids": 5}


def test_the_compile_reports_the_bounds_and_says_the_yaml_key(tmp_path):
    from aclserve.om.compile import compile_model
    from tests.tiny_models import save_graph
    g = graph([gather("t", "ids")], [("ids", TensorProto.INT64)], [("t", (20, 3))])
    g.input[0].CopyFrom(helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 2]))
    g.output[0].CopyFrom(helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 2, 3]))
    lines = []
    result = compile_model(save_graph(g, tmp_path / "m.onnx"), tmp_path / "m.om", target="cpu", log=lines.append)
    assert result.index_bounds == {"ids": 20}
    assert "input ids indexes a table of the model: it takes 0..19 (value_range: [0, 19])" in lines


def test_the_compile_caches_manifest_keeps_the_bounds(tmp_path):
    """The server's compile of a dropped .onnx records them in the cache entry's manifest."""
    import json

    from aclserve.config import CompileOptions
    from aclserve.om import index_bounds as index_bounds_module
    from aclserve.repository import cache_entry, compiler
    from aclserve.repository.compile_cache import CompileCache
    from tests.tiny_models import save_graph
    g = graph([gather("t", "ids")], [("ids", TensorProto.INT32)], [("t", (9, 3))])
    g.input[0].CopyFrom(helper.make_tensor_value_info("ids", TensorProto.INT32, ["N", 2]))
    g.output[0].CopyFrom(helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 2, 3]))
    om = compiler.compiled_om(save_graph(g, tmp_path / "m.onnx"), "m", CompileOptions(), "cpu", tmp_path / "cache")
    assert cache_entry.index_bounds(om) == {"ids": 9}
    manifest = cache_entry.manifest_path(om)
    record = json.loads(manifest.read_text())
    record["index_bounds"] = {"ids": "9", "x": -1, "y": 4}  # (edited by hand: what is not a count is dropped)
    manifest.write_text(json.dumps(record))
    assert cache_entry.index_bounds(om) == {"y": 4}
    # an entry compiled before manifests kept them: read from the .onnx at its next load, and kept
    del record["index_bounds"]
    manifest.write_text(json.dumps(record))
    assert cache_entry.index_bounds(om) is None
    record["index_bounds"], record["index_bounds_rules"] = {}, 1  # read by an earlier edition of the rules
    manifest.write_text(json.dumps(record))
    assert cache_entry.index_bounds(om) is None and cache_entry.BOUNDS_RULES == index_bounds_module.RULES
    cache = CompileCache(str(tmp_path / "cache"), str(tmp_path))
    assert cache.index_bounds(str(tmp_path / "gone.onnx"), str(om)) == {}  # no source to read: none, not kept
    assert json.loads(manifest.read_text())["index_bounds_rules"] == 1
    assert cache.index_bounds(str(tmp_path / "m.onnx"), str(om)) == {"ids": 9}
    assert json.loads(manifest.read_text())["index_bounds"] == {"ids": 9}
    assert cache_entry.problem(om, record["key"]) is None  # (still a sound entry)
