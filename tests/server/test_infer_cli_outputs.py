"""`aclserve infer --output` and `--classification` judged against the model's metadata, which the
command reads first: an output it does not list, or one that has no classes, is the command line's
mistake (exit 2, in the server's words) before anything is sent, and `--classification` alone
classifies the outputs that have classes, printing the others as they are (a tester, t93), or is
refused when none has (or none is listed). Real server (kinds: x FP32 [N,4], b BOOL [N,3] -> y FP32,
h FP16, n BOOL), CPU runtime."""
import asyncio
import logging
import subprocess
import sys

import numpy as np
import pytest
from aiohttp import web

from tests.serving import ServerThread, server_config
from tests.tiny_models import compile_cpu_om, save_graph


@pytest.fixture(scope="module")
def kinds_server(kinds_dir):
    with ServerThread(server_config(kinds_dir)) as srv:
        yield srv


@pytest.fixture
def inputs(tmp_path):
    np.save(tmp_path / "x.npy", np.array([[1.0, 4.0, 2.0, 3.0]], np.float32))
    np.save(tmp_path / "b.npy", np.array([[True, False, True]]))
    return tmp_path


def _infer(server, cwd, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aclserve", "infer", "kinds", "-i", "x=x.npy", "-i", "b=b.npy",
                           *options, "--url", f"http://{server.url}"], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_classification_alone_classifies_the_outputs_that_have_classes(kinds_server, inputs):
    """It asked the server to classify every output: its 400 for the FP16 one failed the whole
    request, exit 1."""
    proc = _infer(kinds_server, inputs, "--classification", "2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == (
        "aclserve infer: output h: FP16, printed as it is (classification is only for integer, FP32 and FP64 "
        "outputs, as in Triton)\n"
        "aclserve infer: output n: BOOL, printed as it is (classification is only for integer, FP32 and FP64 "
        "outputs, as in Triton)\n")
    assert proc.stdout == ("y BYTES [1, 2]\n[['8.000000:1' '6.000000:3']]\n"
                           "h float16 [1, 4]\n[[1. 4. 2. 3.]]\n"
                           "n bool [1, 3]\n[[False  True False]]\n")


@pytest.mark.parametrize("options, refusal", [
    (["--output", "h", "--classification", "1"],
     "output 'h': classification is not available for FP16 outputs (only integer, FP32 and FP64 ones, as in Triton)"),
    (["--output", "y", "--output", "nope"], "unknown output 'nope' (model outputs: 'y', 'h', 'n')"),
    (["--output", "y", "--output", "y"], "--output names 'y' twice"),
])
def test_an_output_the_metadata_refuses_is_the_command_lines_mistake(kinds_server, inputs, options, refusal):
    """Each was the server's 400, exit 1 (a server's error), where an unknown input was exit 2."""
    proc = _infer(kinds_server, inputs, *options)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"aclserve infer: error: {refusal}\n")


def test_classification_where_no_output_has_classes_is_refused_before_anything_is_sent(tmp_path, inputs, caplog):
    """Each output was asked for as it is, with a note, and printed so, exit 0: nothing the option
    asked for was done, where one such output named with --output is refused (exit 2)."""
    from onnx import TensorProto, helper
    caplog.set_level(logging.INFO, logger="aclserve.requests")
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
                               helper.make_node("Not", ["b"], ["n"])], "unranked",
                              [vi("x", TensorProto.FLOAT, ["N", 4]), vi("b", TensorProto.BOOL, ["N", 3])],
                              [vi("h", TensorProto.FLOAT16, ["N", 4]), vi("n", TensorProto.BOOL, ["N", 3])])
    (tmp_path / "models").mkdir()
    compile_cpu_om(save_graph(graph, tmp_path / "unranked.onnx"), tmp_path / "models" / "kinds.om")  # (_infer's name)
    with ServerThread(server_config(tmp_path / "models", request_log=True)) as server:
        proc = _infer(server, inputs, "--classification", "2")
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr == ("aclserve infer: error: model 'kinds': none of its outputs can be classified: they are "
                           "BOOL, FP16 (classification is only for integer, FP32 and FP64 outputs, as in Triton)\n")
    assert [r for r in caplog.records if r.name == "aclserve.requests"] == []  # (no inference request came)


@pytest.mark.asyncio
@pytest.mark.parametrize("listed", [{"outputs": []}, {}])
async def test_classification_of_a_model_whose_metadata_lists_no_outputs_is_refused_unsent(tmp_path, listed):
    """The request named no output, so it asked for no classes, and the outputs the server answered
    were printed as they are, exit 0: the option dropped without a word. aclserve's own metadata
    lists outputs (a model of none is refused by its compile, a CPU OM of none at its load), so a
    foreign server answers it here: a tiny aiohttp app on a real port, noting every inference
    request that reaches it."""
    posted = []

    async def metadata(request):
        return web.json_response({"name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
                                  **listed})

    async def infer(request):
        posted.append(await request.read())
        return web.json_response({"model_name": "m", "outputs": [{"name": "y", "datatype": "FP32", "shape": [1, 4],
                                                                  "data": [1, 4, 2, 3]}]})
    app = web.Application()
    app.router.add_get("/v2/models/m", metadata)
    app.router.add_post("/v2/models/m/infer", infer)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aclserve", "infer", "m", "-i", "x=x.npy", "--classification", "2",
            "--url", f"http://127.0.0.1:{runner.addresses[0][1]}", cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 100)
    finally:
        await runner.cleanup()
    assert (proc.returncode, stdout, posted) == (2, b"", []), stderr
    assert stderr == (b"aclserve infer: error: model 'm': none of its outputs can be classified: its metadata lists "
                      b"none (name them with --output)\n")
