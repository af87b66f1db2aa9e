"""Engine.load's value_ranges: a call holding an integer outside them is refused with a
ValueError worded as the server's 400, before it runs. A token id past an embedding table
reached the model: on the CPU runtime a device fault (the instance rebuilt), a negative one
the table's last rows (ONNX counts from the end); on an NPU an out-of-bounds Gather."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from aclserve.om.compile import compile_model
from aclserve.runtime import Engine

from tests.tiny_models import TOKEN_ROWS, TOKEN_TABLE, affine_onnx, compile_cpu_om, save_graph, token_graph

pytestmark = pytest.mark.usefixtures("clean_faults")


@pytest.fixture
def tokens(tmp_path):
    """The token model (ids INT32 [N, 3] through a Gather of a 50-row table) as a CPU OM of gears
    1, 2, 4, and the ranges its compile found, as Engine.load takes them."""
    result = compile_model(save_graph(token_graph(), tmp_path / "tokens.onnx"), tmp_path / "tokens.om",
                           batch="1,2,4", target="cpu", log=lambda _: None)
    return str(result.path), {name: (0, entries - 1) for name, entries in result.index_bounds.items()}


def test_an_id_outside_the_range_is_refused_before_it_runs(tokens, caplog):
    path, ranges = tokens
    assert ranges == {"ids": (0, TOKEN_ROWS - 1)}
    with caplog.at_level(logging.INFO, logger="aclserve"), Engine(device="cpu") as engine:
        model = engine.load(path, value_ranges=ranges)
        for bad in (TOKEN_ROWS, -1, 2**31 - 1):
            with pytest.raises(ValueError) as refused:
                model.infer({"ids": np.array([[1, bad, 2]], np.int32)})
            assert str(refused.value) == (f"input 'ids': value {bad} is outside 0..{TOKEN_ROWS - 1}, the values the "
                                          f"model takes (value_ranges given to Engine.load)")
        with pytest.raises(ValueError, match=f"input 'ids': value {TOKEN_ROWS} is outside"):
            model.submit({"ids": np.array([[1, 2, 3]] * 6 + [[1, 2, TOKEN_ROWS]], np.int64)})  # in the 2nd run's rows
        ids = np.array([[0, 7, TOKEN_ROWS - 1], [3, 3, 3]], np.int64)  # cast to the model's INT32, then checked
        np.testing.assert_array_equal(model.infer({"ids": ids})["emb"], TOKEN_TABLE[ids])
        assert model.value_ranges["ids"].high == TOKEN_ROWS - 1
    assert "rebuilding instance" not in caplog.text  # nothing bad reached the device


def test_value_ranges_the_model_cannot_take_fail_the_load(tokens, tmp_path):
    path, _ = tokens
    affine = compile_cpu_om(affine_onnx(tmp_path / "affine.onnx"), tmp_path / "affine.om")
    with Engine(device="cpu") as engine:
        for om, given, message in (
                (path, {"z": (0, 1)}, "value_ranges['z']: the model has no input 'z' (inputs: ids)"),
                (affine, {"x": (0, 1)}, "value_ranges['x']: input x is FP32; a value range applies to integer inputs"),
                # (it loaded: a range promising ids no INT32 input can carry)
                (path, {"ids": (0, 2**40)}, "value_ranges['ids']: largest 1099511627776 is outside what INT32 holds "
                                            "(-2147483648..2147483647)"),
                (path, {"ids": (-2**31 - 1, 9)}, "value_ranges['ids']: smallest -2147483649 is outside what INT32 "
                                                 "holds (-2147483648..2147483647)"),
                (path, {"ids": (2**40, 2**41)}, "value_ranges['ids']: smallest 1099511627776 is outside what INT32 "
                                                "holds (-2147483648..2147483647)")):
            with pytest.raises(ValueError) as refused:
                engine.load(om, value_ranges=given)
            assert str(refused.value) == message
        with pytest.raises(ValueError, match=r"value_ranges\['ids'\]: smallest 5 is above largest 1"):
            engine.load(path, value_ranges={"ids": (5, 1)})
        for given in ({"ids": "0..49"}, {"ids": (0, 49.0)}, {"ids": (0,)}, [("ids", (0, 49))], {0: (0, 49)}):
            with pytest.raises(TypeError, match="value_ranges"):
                engine.load(path, value_ranges=given)
        assert engine.models == []  # each failed load closed what it opened
        model = engine.load(path, value_ranges={"ids": (np.int64(0), np.int32(9))})  # numpy's ints are ints
        with pytest.raises(ValueError, match="value 10 is outside 0..9"):
            model.infer({"ids": np.array([[10, 0, 0]], np.int32)})
