"""`aclserve infer` casts its inputs to the datatypes the model's metadata declares when the values
survive it and refuses before sending (exit 2) when they would not, BOOL bytes other than 0 and 1
included; metadata of another shape is ignored. (tests/server/test_infer_cli_casts.py: the same
against the affine model's real server.)"""
from __future__ import annotations

import numpy as np
import pytest

from aclserve.cli.infer_metadata import cast_to_model
from aclserve.cli.usage import UsageError

from tests.infer_command import infer_at


@pytest.mark.parametrize("given, datatype, expected", [
    (np.array([[2**40 + 5, -2**33]]), "INT32", "input x holds -8589934592, outside int32's range"),
    (np.array([[1e6, 1.0]], np.float32), "FP16", r"input x holds 1000000.0, which rounds to inf as float16 \(its "
                                                  r"largest is 65504\): convert it first"),
    # (the refusal said "values past float16's largest (65504)", but 65505 to 65519.99 round to 65504 and go:
    # it names the first value that becomes inf; a tester, t93)
    (np.array([[65519.99, -65520.0]]), "FP16", r"input x holds -65520.0, which rounds to -inf as float16"),
    (np.array([[-1, 2]]), "UINT8", r"input x holds -1, outside uint8's range \[0, 255\]"),
    (np.array([[0, 2]]), "BOOL", r"input x holds 2, outside bool's range \[0, 1\]"),
    # (float data for an integer input was sent as it was, for the server's 400: exit 1, not 2)
    (np.array([[1.0, 2.5]], np.float32), "INT64", "input x is float32, the model takes int64: a cast would change"),
    (np.array([[0.0, 1.0]]), "BOOL", "input x is float64, the model takes bool: a cast would change"),
])
def test_infer_refuses_a_cast_that_would_change_values(given, datatype, expected):
    """int64 [[2**40+5, -2**33]] went to an INT32 model as [[5, 0]]; 1e6 to FP16 as inf."""
    inputs = {"x": given}
    with pytest.raises(UsageError, match=expected):
        cast_to_model(inputs, {"inputs": [{"name": "x", "datatype": datatype}]})


def test_infer_casts_integers_of_either_sign_whose_values_fit():
    """int64 data (numpy's default) for a UINT8 or BOOL input was sent as it was and refused by
    the server (numpy calls int64 -> uint8 unsafe); the values decide (found by a helper)."""
    inputs = {"u": np.array([[0, 255]]), "b": np.array([[1, 0]])}
    notes = cast_to_model(inputs, {"inputs": [{"name": "u", "datatype": "UINT8"}, {"name": "b", "datatype": "BOOL"}]})
    assert inputs["u"].dtype == np.uint8 and inputs["u"].tolist() == [[0, 255]]
    assert inputs["b"].dtype == np.bool_ and inputs["b"].tolist() == [[True, False]] and len(notes) == 2


def test_infer_ignores_metadata_of_another_shape():
    inputs = {"x": np.zeros(2)}
    assert cast_to_model(inputs, {"inputs": 5}) == [] and cast_to_model(inputs, [1]) == []
    assert cast_to_model(inputs, {"inputs": [5, {"name": "x", "datatype": 3}]}) == []


def test_bool_bytes_other_than_0_and_1_are_refused_before_anything_is_sent(tmp_path, caplog):
    """A BOOL .npy of uint8 data holding a 2 went to the server, whose 400 was exit 1 (a server's
    error), where Engine refuses it locally: it is bad input (exit 2), in the same words, unsent (i211)."""
    import logging
    from tests.serving import ServerThread, server_config
    from tests.tiny_models import compile_cpu_om, kinds_onnx
    caplog.set_level(logging.INFO, logger="aclserve.requests")
    (tmp_path / "models").mkdir()
    compile_cpu_om(kinds_onnx(tmp_path / "kinds.onnx"), tmp_path / "models" / "kinds.om")
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    np.save(tmp_path / "b.npy", np.array([[0, 1, 2]], np.uint8).view(bool))
    with ServerThread(server_config(tmp_path / "models", request_log=True)) as server:
        proc = infer_at(f"http://{server.url}", "kinds", "-i", "x=x.npy", "-i", "b=b.npy", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == "aclserve infer: error: input 'b': BOOL elements must be the bytes 0 or 1\n", proc.stderr
    assert [r for r in caplog.records if r.name == "aclserve.requests"] == []  # (no inference request came)
