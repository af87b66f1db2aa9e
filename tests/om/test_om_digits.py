"""The committed example model: models/digits.om is up to date with models/digits.onnx and keeps
the trained classifier's held-out accuracy (recorded by tools/make_example_models.py)."""
from __future__ import annotations

import hashlib
import os

import numpy as np
import onnxruntime as ort
import pytest

from .acl_runner import acl_context, cpu_acl, run_batch
from aclserve.om import container
from tests import REPO

OM = os.path.join(REPO, "models", "digits.om")
ONNX = os.path.join(REPO, "models", "digits.onnx")
HELD_OUT = os.path.join(REPO, "tests", "data", "digits_test.npz")


@pytest.fixture(scope="module")
def held_out():
    data = np.load(HELD_OUT)
    return data["x"], data["y"], float(data["accuracy"])


@pytest.mark.parametrize("name", ["digits.om", "digits_image.om"])
def test_committed_oms_name_their_source_without_a_machine_path(name):
    """The header keeps the path the compile was given: digits_image.om once named a temp
    folder of the machine that built it (../../tmp/...)."""
    path = container.read_header(os.path.join(REPO, "models", name))["source"]["path"]
    assert not os.path.isabs(path) and ".." not in path.split("/"), path


def test_committed_om_was_compiled_from_committed_onnx():
    header = container.read_header(OM)
    with open(ONNX, "rb") as f:
        assert header["source"]["sha256"] == hashlib.sha256(f.read()).hexdigest()
    assert header["gears"] == [1, 2, 4, 8, 16, 32]
    assert [(t["name"], t["dims"]) for t in header["inputs"]] == [("x", [-1, 64]), ("ascend_mbatch_shape_data", [1])]
    assert [(t["name"], t["datatype"], t["dims"]) for t in header["outputs"]] == [("y", "FP32", [-1, 10])]


def _chunks(n, gears):
    """Split n samples into batches of the largest gear; the tail is padded to the next gear up."""
    start = 0
    while start < n:
        take = min(gears[-1], n - start)
        yield start, take, next(g for g in gears if g >= take)
        start += take


def test_payload_accuracy_equals_recorded(held_out):
    x, y, accuracy = held_out
    sess = ort.InferenceSession(container.read(OM).payload, providers=["CPUExecutionProvider"])
    probs = sess.run(["y"], {"x": x})[0]
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    assert float(np.mean(probs.argmax(1) == y)) == accuracy
    assert accuracy > 0.9  # a trained classifier, not seeded noise


def test_cpu_runtime_accuracy_equals_recorded(held_out):
    acl = cpu_acl()
    x, y, accuracy = held_out
    gears = container.read_header(OM)["gears"]
    predictions = []
    with acl_context(acl):
        for start, take, gear in _chunks(len(x), gears):
            batch = np.zeros((gear, 64), np.float32)
            batch[:take] = x[start:start + take]
            probs = run_batch(acl, OM, {"x": batch}, gear)["y"]
            assert probs.shape == (gear, 10)
            predictions.append(probs[:take].argmax(1))
    assert float(np.mean(np.concatenate(predictions) == y)) == accuracy
