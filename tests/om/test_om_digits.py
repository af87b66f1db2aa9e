"""The committed example models: models/digits.om and models/digits_image.om are what compiling
models/digits.onnx gives today, and keep the trained classifier's held-out accuracy (recorded by
tools/make_example_models.py)."""
from __future__ import annotations

import hashlib
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from .acl_runner import acl_context, cpu_acl, run_batch
from aclserve.om import container
from aclserve.om.compile import compile_model
from tests import REPO

sys.path.insert(0, os.path.join(REPO, "tools"))
import make_example_models  # noqa: E402

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


def _signature(payload: bytes) -> list:
    """A CPU OM payload's inputs and outputs as ONNX Runtime gets them: names, types, dims."""
    graph = onnx.load_from_string(payload).graph
    return [[(v.name, v.type.tensor_type.elem_type,
              [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]) for v in values]
            for values in (graph.input, graph.output)]


def _header_but_versions(header: dict) -> dict:
    """The header without what names the tools' versions (and the payload's hash, which moves
    with ONNX Runtime's optimiser; the header's own, which moves with all of it: OMs from before
    it have none)."""
    kept = {k: v for k, v in header.items() if k not in ("producer", "payload_sha256", "header_sha256")}
    kept["options"] = {k: v for k, v in header.get("options", {}).items() if k != "onnxruntime"}
    return kept


def test_committed_oms_are_what_compiling_their_source_gives_today(tmp_path, monkeypatch):
    """A change of the compiler must come with the committed OMs rebuilt (tools/make_example_models.py):
    digits_image.om once kept an output shape the compiler no longer wrote, and a running
    server reloaded it when a user ran the tool. Byte for byte under the ONNX Runtime and
    aclserve versions that built them; else their headers (but the versions) and their
    payloads' inputs and outputs (ONNX Runtime's optimiser may write the graph otherwise)."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", make_example_models.SOURCE_DATE_EPOCH)
    monkeypatch.chdir(REPO)  # as the tool compiles: the header names the source relative to it
    compile_model(os.path.relpath(ONNX, REPO), tmp_path / "digits.om", target="cpu", log=lambda _: None)
    mlp = onnx.load(ONNX)
    make_example_models.make_digits_image(mlp, str(tmp_path), om_path=str(tmp_path / "digits_image.om"))
    for name in ("digits.om", "digits_image.om"):
        committed, fresh = container.read(os.path.join(REPO, "models", name)), container.read(tmp_path / name)
        stale = f"models/{name} is stale: run tools/make_example_models.py"
        assert _header_but_versions(committed.header) == _header_but_versions(fresh.header), stale
        assert _signature(committed.payload) == _signature(fresh.payload), stale
        if committed.header["options"].get("onnxruntime") == ort.__version__ and \
                committed.header.get("producer") == fresh.header.get("producer"):
            with open(os.path.join(REPO, "models", name), "rb") as a, open(tmp_path / name, "rb") as b:
                assert a.read() == b.read(), stale


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
