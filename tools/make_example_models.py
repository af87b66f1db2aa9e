#!/usr/bin/env python3
"""Make aclserve's example models, deterministically (fixed seeds, no downloads; ~10 s).

Committed (run from anywhere; paths are relative to the repository root):
  models/digits.onnx          a real classifier: scikit-learn MLPClassifier (64 -> 64 ReLU -> 10)
                              trained on sklearn.datasets.load_digits, exported by hand with
                              onnx.helper. Input "x" FP32 [batch, 64]: the 8x8 image flattened,
                              raw pixel intensities 0..16 (the model scales by 1/16 itself).
                              Output "y" FP32 [batch, 10]: class probabilities (softmax).
  models/digits.om            the same, compiled to a CPU OM (gears 1,2,4,8,16,32) so
                              `aclserve serve` works out of the box.
  tests/data/digits_test.npz  the held-out split: x [n, 64] float32, y [n] int64, and
                              accuracy = the trained classifier's held-out accuracy.
  models/digits_image.om      the same classifier taking images: built from digits_image.onnx
                              (the MLP behind a Reshape, input "x" FP32 [batch, 1, 8, 8]) with
                              static AIPP (`--image-input gray --std 15.9375`), so the OM takes
                              uint8 grey pixels [batch, 8, 8, 1] and scales 0-255 to 0-16 itself;
                              models/digits_image.yaml declares "x" an image input.
Written to OUTDIR too: digits_image.onnx (the AIPP source, e.g. to build it with ATC).

Benchmark models (written to OUTDIR, default out/models/, not committed). Their weights are
seeded random numbers, not trained: they measure speed, their outputs mean nothing.
  medium.onnx  CNN: 3 x (Conv3x3 + Relu + MaxPool2) with 32/64/96 channels + Gemm head,
               input "x" FP32 [N, 3, 64, 64], output "y" FP32 [N, 10]
  light.onnx   MLP 64 -> 256 -> 256 -> 10, input "x" FP32 [N, 64], output "y" FP32 [N, 10]
  heavy.onnx   the medium CNN with 36/72/108 channels (about 1 ms per row on one core here),
               same input and output; the closed-loop priority benchmark's model

Usage: python tools/make_example_models.py [OUTDIR] [--skip-digits]
scikit-learn is needed here only (a tool dependency, not a runtime one).
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPSET = 17
IR_VERSION = 9  # loadable by onnxruntime >= 1.15
DIGITS_SEED = 0
SOURCE_DATE_EPOCH = "1767225600"  # 2026-01-01: the committed OMs' headers are reproducible
DIGITS_IMAGE_OM = os.path.join(ROOT, "models", "digits_image.om")


def _save(model: onnx.ModelProto, path: str) -> None:
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    with open(path, "wb") as f:
        f.write(model.SerializeToString(deterministic=True))


def _model(graph, producer: str) -> onnx.ModelProto:
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name=producer)


# -- digits: a trained classifier ---------------------------------------------------------------
def train_digits():
    """Return (classifier, x_test raw 0..16, y_test, held-out accuracy)."""
    from sklearn.datasets import load_digits
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=DIGITS_SEED, stratify=y)
    clf = MLPClassifier(hidden_layer_sizes=(64,), activation="relu", max_iter=300, random_state=DIGITS_SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(x_train / 16.0, y_train)
    accuracy = float(np.mean(clf.predict(x_test / 16.0) == y_test))
    return clf, x_test.astype(np.float32), y_test.astype(np.int64), accuracy


def export_digits(clf) -> onnx.ModelProto:
    (w0, w1), (b0, b1) = clf.coefs_, clf.intercepts_  # coefs are [in, out]: Gemm without transB
    inits = [
        numpy_helper.from_array(np.array(1.0 / 16.0, np.float32), "scale"),
        numpy_helper.from_array(w0.astype(np.float32), "W0"), numpy_helper.from_array(b0.astype(np.float32), "B0"),
        numpy_helper.from_array(w1.astype(np.float32), "W1"), numpy_helper.from_array(b1.astype(np.float32), "B1"),
    ]
    nodes = [
        helper.make_node("Mul", ["x", "scale"], ["xs"], name="scale_pixels"),
        helper.make_node("Gemm", ["xs", "W0", "B0"], ["h0"], name="hidden"),
        helper.make_node("Relu", ["h0"], ["a0"], name="relu"),
        helper.make_node("Gemm", ["a0", "W1", "B1"], ["logits"], name="head"),
        helper.make_node("Softmax", ["logits"], ["y"], axis=1, name="softmax"),
    ]
    graph = helper.make_graph(nodes, "digits_mlp",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])], inits)
    return _model(graph, "aclserve tools/make_example_models.py")


def export_digits_image(mlp: onnx.ModelProto) -> onnx.ModelProto:
    """The digits MLP (export_digits) behind a Reshape: x FP32 [batch, 1, 8, 8] (NCHW, an image
    input)."""
    graph = onnx.GraphProto()
    graph.CopyFrom(mlp.graph)
    shape = numpy_helper.from_array(np.array([-1, 64], np.int64), "flat_shape")
    nodes = [helper.make_node("Reshape", ["x", "flat_shape"], ["x_flat"], name="flatten")]
    for node in graph.node:
        node.input[:] = ["x_flat" if i == "x" else i for i in node.input]
        nodes.append(node)
    image_graph = helper.make_graph(nodes, "digits_image_mlp",
                                    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 8, 8])],
                                    list(graph.output), list(graph.initializer) + [shape])
    return _model(image_graph, "aclserve tools/make_example_models.py")


def make_digits_image(mlp: onnx.ModelProto, outdir: str, om_path: str = DIGITS_IMAGE_OM) -> None:
    """Write digits_image.onnx to `outdir` and compile it to `om_path` (tests compare a fresh
    build with the committed file)."""
    from aclserve.om import aipp
    from aclserve.om.compile import compile_model

    src = os.path.join(outdir, "digits_image.onnx")
    _save(export_digits_image(mlp), src)
    # uint8 grey pixels 0-255 in; AIPP multiplies by 16/255 to the 0-16 the MLP was trained on
    ops = [aipp.generate("gray", None, str(255 / 16))]
    cwd = os.getcwd()
    os.chdir(outdir)  # the header names the source by its file name alone: the same bytes whatever OUTDIR is
    try:
        compile_model("digits_image.onnx", om_path, target="cpu", aipp=ops, log=lambda s: None)
    finally:
        os.chdir(cwd)
    print(f"digits_image: {os.path.relpath(om_path, ROOT)} (AIPP, uint8 [batch, 8, 8, 1]) from {os.path.relpath(src)}")


def make_digits(outdir: str) -> None:
    sys.path.insert(0, ROOT)  # the package is not installed in a fresh checkout
    from aclserve.om.compile import compile_model  # first: aclserve turns ONNX Runtime's telemetry off

    import onnxruntime as ort

    clf, x_test, y_test, accuracy = train_digits()
    os.makedirs(os.path.join(ROOT, "models"), exist_ok=True)
    os.makedirs(os.path.join(ROOT, "tests", "data"), exist_ok=True)
    onnx_rel = os.path.join("models", "digits.onnx")
    mlp = export_digits(clf)
    _save(mlp, os.path.join(ROOT, onnx_rel))
    sess = ort.InferenceSession(os.path.join(ROOT, onnx_rel), providers=["CPUExecutionProvider"])
    onnx_acc = float(np.mean(sess.run(["y"], {"x": x_test})[0].argmax(1) == y_test))
    if onnx_acc != accuracy:  # the export must be the classifier, not an approximation of it
        raise SystemExit(f"ONNX export accuracy {onnx_acc} differs from the classifier's {accuracy}")
    np.savez(os.path.join(ROOT, "tests", "data", "digits_test.npz"), x=x_test, y=y_test, accuracy=np.float64(accuracy))
    cwd = os.getcwd()
    os.chdir(ROOT)  # keep the source path in the committed header relative
    try:
        os.environ.setdefault("SOURCE_DATE_EPOCH", SOURCE_DATE_EPOCH)
        compile_model(onnx_rel, os.path.join("models", "digits.om"), target="cpu", log=lambda s: None)
        make_digits_image(mlp, outdir)
    finally:
        os.chdir(cwd)
    print(f"digits: models/digits.onnx + models/digits.om, held-out accuracy {accuracy:.4f} on {len(y_test)} samples")


# -- benchmark models: seeded weights, not trained ----------------------------------------------
def _he(rng, shape, fan_in):
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


def build_light(seed: int = 1) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    sizes = [64, 256, 256, 10]
    inits, nodes, cur = [], [], "x"
    for i in range(3):
        inits += [numpy_helper.from_array(_he(rng, (sizes[i + 1], sizes[i]), sizes[i]), f"W{i}"),
                  numpy_helper.from_array((rng.standard_normal(sizes[i + 1]) * 0.01).astype(np.float32), f"B{i}")]
        last = i == 2
        nodes.append(helper.make_node("Gemm", [cur, f"W{i}", f"B{i}"], ["y" if last else f"g{i}"], transB=1))
        if not last:
            nodes.append(helper.make_node("Relu", [f"g{i}"], [f"h{i}"]))
            cur = f"h{i}"
    graph = helper.make_graph(nodes, "light_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
    return _model(graph, "aclserve benchmark (seeded weights)")


def build_medium(seed: int = 2, channels=(32, 64, 96)) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits, nodes, cur, cin, side = [], [], "x", 3, 64
    for i, cout in enumerate(channels):
        inits += [numpy_helper.from_array(_he(rng, (cout, cin, 3, 3), cin * 9), f"CW{i}"),
                  numpy_helper.from_array((rng.standard_normal(cout) * 0.01).astype(np.float32), f"CB{i}")]
        nodes += [helper.make_node("Conv", [cur, f"CW{i}", f"CB{i}"], [f"c{i}"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"]),
                  helper.make_node("MaxPool", [f"r{i}"], [f"p{i}"], kernel_shape=[2, 2], strides=[2, 2])]
        cur, cin, side = f"p{i}", cout, side // 2
    features = cin * side * side
    inits += [numpy_helper.from_array(_he(rng, (10, features), features), "FW"),
              numpy_helper.from_array((rng.standard_normal(10) * 0.01).astype(np.float32), "FB")]
    nodes += [helper.make_node("Flatten", [cur], ["flat"], axis=1),
              helper.make_node("Gemm", ["flat", "FW", "FB"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "medium_cnn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 64, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
    return _model(graph, "aclserve benchmark (seeded weights)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", nargs="?", default=os.path.join(ROOT, "out", "models"),
                        help="folder for the benchmark models (default out/models/)")
    parser.add_argument("--skip-digits", action="store_true", help="only write the benchmark models")
    args = parser.parse_args(argv)
    args.outdir = os.path.abspath(args.outdir)  # the digits step works from the repository's root
    os.makedirs(args.outdir, exist_ok=True)
    if not args.skip_digits:
        make_digits(args.outdir)
    for name, model in (("light", build_light()), ("medium", build_medium()),
                        ("heavy", build_medium(seed=3, channels=(36, 72, 108)))):
        path = os.path.join(args.outdir, f"{name}.onnx")
        _save(model, path)
        print(f"{name}: {path} (seeded weights, for benchmarks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
