"""`aclserve compile` compiles in a child process (compile_process.py), which imports onnx and ONNX
Runtime; the command's own process, which only waits for it, imported onnx all the same (through
om/atc.py, om/spec.py and om/aipp.py), with an AIPP config too. Only --image-input NAME:colour,
which reads the model's input names to find NAME's rank, still imports it there."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests import REPO
from tests.tiny_models import conv_onnx

# `aclserve compile ARGS` in this process, then the heavy packages it imported, on the last line
AUDIT = ("import sys; from aclserve.cli import main; status = main(sys.argv[1:]); "
         "print(status, sorted({m.split('.')[0] for m in sys.modules} & {'onnx', 'onnxruntime'}))")


@pytest.mark.parametrize("aipp", [(), ("--image-input", "rgb")], ids=["plain", "image-input"])
def test_the_compile_commands_own_process_imports_no_onnx(tmp_path, aipp):
    model = conv_onnx(tmp_path / "conv.onnx")
    proc = subprocess.run([sys.executable, "-c", AUDIT, "compile", model, "-o", tmp_path / "conv.om", "--target",
                           "cpu", *aipp], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.stdout.splitlines()[-1] == "0 []", (proc.stdout, proc.stderr)
    assert (tmp_path / "conv.om").exists()
