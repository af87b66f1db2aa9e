"""`aclserve infer` against a real server (CPU runtime): the model's metadata, read first, says
where an input's name ends, which inputs the model takes and which files suit them, and a
refusal of it ends the command; an image input is sent and its classes asked for; outputs are
printed whole (or said elided), JSON's non-finite values as null."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.infer_command import infer_at


def test_infer_json_writes_non_finite_outputs_as_null_like_the_server():
    """--json wrote bare NaN / Infinity tokens, which strict JSON parsers refuse."""
    from aclserve.cli.infer import _json_text
    written = json.loads(_json_text({"y": np.array([[1.0, np.nan], [np.inf, -2.0]], np.float32),
                                     "i": np.array([3, 4], np.int64)}))
    assert written["y"]["data"] == [[1.0, None], [None, -2.0]] and written["i"]["data"] == [3, 4]


def test_infer_json_writes_fp32_outputs_as_the_server_s_json_answer_does(tmp_path):
    """--json wrote FP32 values through float64, with its noise digits (`0.008342617191374302` where
    the server's JSON answer has `0.008342617`): README says it follows the server's JSON outputs."""
    from tests import REPO
    from tests.serving import ServerThread, request, server_config
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "models" / "digits.om")
    x = np.load(REPO / "tests" / "data" / "digits_test.npz")["x"][:2].astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                                   "data": x.reshape(-1).tolist()}]}).encode()
    with ServerThread(server_config(tmp_path / "models")) as server:
        printed = infer_at(f"http://{server.url}", "digits", "-i", "x=x.npy", "--json", cwd=tmp_path)
        status, _, answer = request(server, "POST", "/v2/models/digits/infer", data=body)
    assert printed.returncode == 0 and status == 200, printed.stderr + answer.decode()
    written = json.loads(printed.stdout, parse_float=str)["y"]  # (each value as its digits were written)
    served = json.loads(answer, parse_float=str)["outputs"][0]
    assert written["dtype"] == "float32" and written["shape"] == served["shape"] == [2, 10]
    assert [value for row in written["data"] for value in row] == served["data"], (written, served)


def test_infer_sends_an_image_and_asks_for_its_classes(tmp_path):
    """`-i x=digit.png` was "not a .npy file", and a classification's BYTES output "not
    supported by this client": the README's image model could not be used from the CLI (found
    by a helper). Either file given to the other kind of input is refused before it is sent (exit 2):
    a .npy for the image input went to the server, whose 400 was exit 1 (tester t69)."""
    import shutil
    from PIL import Image
    from tests import REPO
    from tests.serving import ServerThread, server_config
    (tmp_path / "models").mkdir()
    for name in ("digits_image.om", "digits_image.yaml", "digits_labels.txt", "digits.om"):
        shutil.copy(REPO / "models" / name, tmp_path / "models" / name)
    x = np.load(REPO / "tests" / "data" / "digits_test.npz")["x"][0]
    Image.fromarray((x.reshape(8, 8) * 255 / 16).astype("uint8")).resize((32, 32)).save(tmp_path / "digit.png")
    np.save(tmp_path / "x.npy", x[None].astype(np.float32))
    with ServerThread(server_config(tmp_path / "models")) as server:
        def infer(*more, model="digits_image", given="x=digit.png"):
            return subprocess.run([sys.executable, "-m", "aclserve", "infer", model, "-i", given,
                                   "--url", f"http://{server.url}", "--json", *more], cwd=tmp_path,
                                  capture_output=True, text=True, timeout=120)
        scores, top, not_an_image_input = infer(), infer("--classification", "2"), infer(model="digits")
        not_an_image = infer(given="x=x.npy")
    assert not_an_image_input.returncode == 2 and "input x takes FP32 tensors: an image (JPEG, PNG) goes to " \
        "an image input (BYTES)" in not_an_image_input.stderr, not_an_image_input.stderr
    assert not_an_image.returncode == 2 and not_an_image.stderr == (
        "aclserve infer: error: input x takes BYTES (encoded images): give a JPEG or PNG file here; a .npy file "
        "goes to a numeric input\n"), not_an_image.stderr
    assert scores.returncode == 0 and top.returncode == 0, scores.stderr + top.stderr
    y = json.loads(scores.stdout)["y"]
    assert y["shape"] == [1, 10] and y["dtype"] == "float32"
    best = np.argsort(y["data"][0])[::-1][:2]
    classes = json.loads(top.stdout)["y"]
    assert classes["shape"] == [1, 2] and classes["dtype"] == "BYTES"
    assert [c.split(":")[1:] for c in classes["data"][0]] == [[str(i), str(i)] for i in best]


def test_infer_prints_an_output_whole_or_says_that_values_were_elided(tmp_path):
    """A [32, 10] output was printed with "..." in place of most of its values (numpy's
    threshold of 200), without a word: README says it prints the outputs."""
    from tests import REPO
    from tests.serving import ServerThread, server_config
    from tests.tiny_models import compile_cpu_om, double_onnx
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "models" / "digits.om")
    compile_cpu_om(double_onnx(tmp_path / "double.onnx"), tmp_path / "models" / "double.om", batch="64")
    np.save(tmp_path / "x.npy", np.ones((32, 64), np.float32))
    np.save(tmp_path / "x16.npy", np.arange(64 * 16, dtype=np.float32).reshape(64, 16))
    with ServerThread(server_config(tmp_path / "models", model_control_mode="none")) as server:
        whole = infer_at(f"http://{server.url}", "digits", "-i", "x=x.npy", cwd=tmp_path)
        elided = infer_at(f"http://{server.url}", "double", "-i", "x=x16.npy", cwd=tmp_path)
    assert whole.returncode == 0 and elided.returncode == 0, whole.stderr + elided.stderr
    head, *values = whole.stdout.splitlines()
    assert head == "y float32 [32, 10]" and "..." not in whole.stdout
    assert len(" ".join(values).replace("[", " ").replace("]", " ").split()) == 320
    assert elided.stdout.splitlines()[0] == ("y float32 [64, 16] (1,024 values: the middle ones elided here; "
                                             "--json prints them all)")
    assert "..." in elided.stdout and elided.stdout.endswith("2.046e+03]]\n")  # (the last value, 2 x 1023)


def test_infer_takes_an_input_whose_name_holds_an_equals_sign(tmp_path):
    """`-i "a=b=/path/e.npy"` was split at the first '=': input "a" from file "b=/path/e.npy". The
    model's input names (its metadata) say where NAME ends; the first '=' otherwise."""
    from onnx import TensorProto, helper, numpy_helper
    from tests.serving import ServerThread, server_config
    from tests.tiny_models import compile_cpu_om, save_graph
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Mul", ["a=b", "two"], ["y"]), helper.make_node("Neg", ["c"], ["z"])],
                              "equals", [vi("a=b", TensorProto.FLOAT, ["N", 4]), vi("c", TensorProto.FLOAT, ["N", 4])],
                              [vi("y", TensorProto.FLOAT, ["N", 4]), vi("z", TensorProto.FLOAT, ["N", 4])],
                              [numpy_helper.from_array(np.array(2, np.float32), "two")])
    (tmp_path / "models").mkdir()
    compile_cpu_om(save_graph(graph, tmp_path / "equals.onnx"), tmp_path / "models" / "equals.om")
    np.save(tmp_path / "e.npy", np.arange(4, dtype=np.float32).reshape(1, 4))
    np.save(tmp_path / "c=.npy", np.ones((1, 4), np.float32))  # (a file holding "=" after a name that holds none)
    with ServerThread(server_config(tmp_path / "models")) as server:
        proc = subprocess.run([sys.executable, "-m", "aclserve", "infer", "equals", "-i", f"a=b={tmp_path / 'e.npy'}",
                               "-i", "c=c=.npy", "--url", f"http://{server.url}", "--json"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    outputs = json.loads(proc.stdout)
    assert outputs["y"]["data"] == [[0.0, 2.0, 4.0, 6.0]] and outputs["z"]["data"] == [[-1.0] * 4], outputs


def test_an_input_the_model_does_not_take_is_bad_input(tmp_path):
    """`-i z=x.npy` for a model of input x went to the server, whose 400 was "a server's error"
    (exit 1): the metadata read first names the inputs, so it is bad input (exit 2), in the server's words."""
    from tests import REPO
    from tests.serving import ServerThread, server_config
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "models" / "digits.om")
    np.save(tmp_path / "x.npy", np.zeros((1, 64), np.float32))
    with ServerThread(server_config(tmp_path / "models")) as server:
        unknown = infer_at(f"http://{server.url}", "digits", "-i", "z=x.npy", cwd=tmp_path)
        known = infer_at(f"http://{server.url}", "digits", "-i", "x=x.npy", "--json", cwd=tmp_path)
    assert unknown.returncode == 2, unknown.stderr
    assert unknown.stderr.strip() == "aclserve infer: error: unknown input 'z' (model inputs: 'x')", unknown.stderr
    assert known.returncode == 0 and json.loads(known.stdout)["y"]["shape"] == [1, 10], known.stderr


@pytest.mark.parametrize("target, said", [(("nomodel",), "HTTP 404: unknown model 'nomodel'"),
                                          (("digits", "--version", "7"), "HTTP 404: model digits has no version 7")])
def test_a_refused_metadata_request_is_the_answer_and_nothing_is_sent_after_it(tmp_path, caplog, target, said):
    """A metadata request the server refused (404 here; 503 for a model loading) was taken for "no
    metadata": the checks it feeds were skipped (a picture for a numeric input) and the inference
    sent anyway, for the server's reading of it (a tester, t86). The refusal ends the command."""
    import logging
    from PIL import Image
    from tests import REPO
    from tests.serving import ServerThread, server_config
    caplog.set_level(logging.INFO, logger="aclserve.requests")
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "digits.om", tmp_path / "models" / "digits.om")
    Image.new("L", (8, 8)).save(tmp_path / "digit.png")
    with ServerThread(server_config(tmp_path / "models", request_log=True)) as server:
        proc = infer_at(f"http://{server.url}", *target, "-i", "x=digit.png", cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr == f"aclserve infer: error: {said}\n", proc.stderr
    assert [r for r in caplog.records if r.name == "aclserve.requests"] == []  # (no inference request came)
