"""`aclserve infer`'s inputs: cast within a kind to the model's datatype, said; a scalar sent with its
shape; .npy files that cannot be sent named in one line."""
from __future__ import annotations

import numpy as np
import pytest

from aclserve.cli.infer_metadata import cast_to_model


def test_infer_client_casts_within_a_kind_and_says_so():
    inputs = {"x": np.zeros((2, 64))}
    notes = cast_to_model(inputs, {"inputs": [{"name": "x", "datatype": "FP32"}]})
    assert inputs["x"].dtype == np.float32 and notes == ["input x: float64 cast to FP32 as the model declares"]


def test_infer_client_sends_a_scalar_input_with_its_shape(tmp_path):
    """np.ascontiguousarray turned a 0-d .npy into shape [1], which a model with a scalar input refuses."""
    from aclserve.cli.infer import _load_inputs, build_request
    import json
    np.save(tmp_path / "s.npy", np.float32(-2.5))
    np.save(tmp_path / "f.npy", np.zeros((3, 4), np.float32).T)  # not C-contiguous: still sent in C order
    inputs = _load_inputs([f"x={tmp_path / 's.npy'}", f"t={tmp_path / 'f.npy'}"])
    body, length = build_request(inputs, [])
    head = json.loads(body[:length])
    assert [i["shape"] for i in head["inputs"]] == [[], [4, 3]]
    assert inputs["t"].flags.c_contiguous and len(body) == length + 4 + 48


@pytest.mark.parametrize("case", ["twice", "not npy", "npz", "fifo", "folder"])
def test_infer_inputs_that_cannot_be_sent_are_named_in_one_line(tmp_path, case):
    """A name given twice kept the second file; a file that is not a .npy got numpy's advice on
    loading pickles, an .npz an AttributeError, a FIFO held the command until written to."""
    import os
    from aclserve.cli.infer import _load_inputs
    from aclserve.cli.usage import UsageError
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    good = f"x={tmp_path / 'x.npy'}"
    if case == "twice":
        pairs, expected = [good, good], "--input names 'x' twice"
    elif case == "not npy":
        (tmp_path / "m.onnx").write_bytes(b"\x08\x07garbage")
        pairs, expected = [f"x={tmp_path / 'm.onnx'}"], "not a .npy file"
    elif case == "npz":
        np.savez(tmp_path / "a.npz", x=np.ones(2))
        pairs, expected = [f"x={tmp_path / 'a.npz'}"], "not a .npy file"
    elif case == "fifo":
        os.mkfifo(tmp_path / "pipe")
        pairs, expected = [f"x={tmp_path / 'pipe'}"], "not a regular file"
    else:
        pairs, expected = [f"x={tmp_path}"], "not a regular file"
    with pytest.raises(UsageError, match=expected):
        _load_inputs(pairs)
