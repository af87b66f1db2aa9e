"""`aclserve infer --output` and `--classification` judged against the model's metadata, which the
command reads first: an output it does not list, or one that has no classes, is the command line's
mistake (exit 2, in the server's words) before anything is sent, and `--classification` alone
classifies the outputs that have classes, printing the others as they are (a tester, t93). Real
server (kinds: x FP32 [N,4], b BOOL [N,3] -> y FP32, h FP16, n BOOL), CPU runtime."""
import subprocess
import sys

import numpy as np
import pytest

from tests.serving import ServerThread, server_config


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
