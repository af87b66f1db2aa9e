"""The Python API's Engine refuses a call's inputs in the server's words for the same mistakes
(aclserve/input_refusals.py): it said "unknown input(s) ['zz']; the model takes [...]", "missing
input 'idx'", "expected ['N', 8]" and a row mismatch naming no input where the server's 400 said
otherwise (a tester). The same inputs given to a real Engine and, as KServe v2 JSON, to a real
server on a real port, both on the CPU runtime, one after the other."""
from __future__ import annotations

import json

import numpy as np
import pytest

from aclserve.runtime import Engine
from tests.serving import ServerThread, request, server_config

X = np.ones((2, 8), np.float32)
IDX = np.ones((2, 3), np.int64)
MISTAKES = {  # the mistake: a call's inputs (in the order a request lists them)
    "unknown input": {"x": X, "idx": IDX, "zz": X},
    "missing input": {"x": X},
    "shape": {"x": X[:, :7], "idx": IDX},
    "rows that differ": {"x": X, "idx": np.ones((3, 3), np.int64)},
    "no rows": {"x": X[:0], "idx": IDX[:0]},
    # more than one mistake: the server names the first of a given input's before any missing
    # one, and the given ones in the request's order (the Engine named the missing input, an
    # unknown one anywhere, and the inputs' mistakes in the model's order)
    "a shape, and one missing": {"x": X[:, :7]},
    "a shape, then an unknown input": {"x": X[:, :7], "idx": IDX, "zz": X},
    "rows that differ, in the call's order": {"idx": IDX, "x": X[:1]},
    "shapes, in the call's order": {"idx": IDX[:, :2], "x": X[:, :7]},
}
WORDS = {
    "unknown input": "unknown input 'zz' (model inputs: 'x', 'idx')",
    "missing input": "missing input(s): 'idx'",
    "shape": "input 'x': shape [2, 7] does not match the model's [-1, 8]",
    "rows that differ": "input 'idx': batch size 3 differs from the other inputs' 2",
    "no rows": "input 'x': batch dimension must be at least 1",
    "a shape, and one missing": "input 'x': shape [2, 7] does not match the model's [-1, 8]",
    "a shape, then an unknown input": "input 'x': shape [2, 7] does not match the model's [-1, 8]",
    "rows that differ, in the call's order": "input 'x': batch size 1 differs from the other inputs' 2",
    "shapes, in the call's order": "input 'idx': shape [2, 2] does not match the model's [-1, 3]",
}


def as_json(inputs: dict) -> dict:
    return {"inputs": [{"name": name, "datatype": "FP32" if array.dtype == np.float32 else "INT64",
                        "shape": list(array.shape), "data": array.ravel().tolist()} for name, array in inputs.items()]}


@pytest.fixture(scope="module")
def answers(models_dir) -> dict[str, tuple[str, str]]:
    """mistake -> (the Engine's ValueError, the server's 400)."""
    engine_said = {}
    with Engine(device="cpu") as engine:
        model = engine.load(models_dir / "affine.om", warmup=False, retry=False)
        for mistake, inputs in MISTAKES.items():
            with pytest.raises(ValueError) as refused:
                model.infer(inputs)
            engine_said[mistake] = str(refused.value)
    server_said = {}
    with ServerThread(server_config(models_dir)) as srv:
        for mistake, inputs in MISTAKES.items():
            status, _, body = request(srv, "POST", "/v2/models/affine/infer", json=as_json(inputs))
            assert status == 400, body
            server_said[mistake] = json.loads(body)["error"]
    return {mistake: (engine_said[mistake], server_said[mistake]) for mistake in MISTAKES}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_the_engine_says_what_the_server_says(answers, mistake):
    assert answers[mistake] == (WORDS[mistake], WORDS[mistake])


def test_an_input_name_that_is_not_a_string_is_a_type_error(models_dir):
    with Engine(device="cpu") as engine:
        model = engine.load(models_dir / "affine.om", warmup=False, retry=False)
        with pytest.raises(TypeError, match=r"^input names are strings, not int: 0$"):
            model.infer({"x": X, "idx": IDX, 0: X})


def test_bool_bytes_other_than_0_and_1_are_refused_as_the_server_refuses_them(kinds_dir):
    """uint8 data viewed as bool holds bools that are neither: the server's 400 refused the bytes 2
    on the binary extension, where the Engine ran them and a `Not` answered [1, 0, 3] (a tester, t93)."""
    x, b = np.ones((1, 4), np.float32), np.array([[0, 1, 2]], np.uint8).view(bool)
    with Engine(device="cpu") as engine:
        model = engine.load(kinds_dir / "kinds.om", warmup=False, retry=False)
        with pytest.raises(ValueError) as refused:
            model.infer({"x": x, "b": b})
        assert model.infer({"x": x, "b": b.view(np.uint8) == 1})["n"].tolist() == [[True, False, True]]
    head = json.dumps({"inputs": [{"name": name, "datatype": datatype, "shape": list(array.shape),
                                   "parameters": {"binary_data_size": array.nbytes}}
                                  for name, datatype, array in (("x", "FP32", x), ("b", "BOOL", b))]}).encode()
    with ServerThread(server_config(kinds_dir)) as srv:
        status, _, body = request(srv, "POST", "/v2/models/kinds/infer", data=head + x.tobytes() + b.tobytes(),
                                  headers={"Inference-Header-Content-Length": str(len(head))})
    assert status == 400, body
    assert str(refused.value) == json.loads(body)["error"] == "input 'b': BOOL elements must be the bytes 0 or 1"
