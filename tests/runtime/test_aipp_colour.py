"""The colour order an image input's static AIPP takes, as the model loads (om_model.py reads it
with acl.mdl.get_first_aipp_info): on the CPU runtime, and on one presenting a pyACL without
that call (ACLSERVE_CPU_LACKS), where nothing is said and the image settings decide. Each case
in a process of its own: the CPU runtime reads ACLSERVE_CPU_LACKS when ACL starts."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from aclserve.om import aipp
from tests import REPO
from tests.tiny_models import compile_cpu_om, conv_onnx

SCRIPT = r'''
import json, sys
from aclserve.runtime import AclRuntime, open_pool
with AclRuntime("cpu") as runtime:
    pool = open_pool(runtime, sys.argv[1], "m")
    print(json.dumps([spec.aipp_color for spec in pool.inputs]))
    pool.close()
'''


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("aipp_colour")
    onnx_path = conv_onnx(root / "conv.onnx")
    paths = {}
    for colour in ("rgb", "bgr"):
        paths[colour] = str(compile_cpu_om(onnx_path, root / f"{colour}.om", batch="1,2", aipp=[aipp.generate(colour)]))
    paths["none"] = str(compile_cpu_om(onnx_path, root / "none.om", batch="1,2"))
    return paths


def colours(path: str, lacks: str = "") -> list:
    env = {**os.environ, "ACLSERVE_CPU_LACKS": lacks, "PYTHONPATH": REPO}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, path], capture_output=True, text=True, env=env,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_aipp_says_what_pixels_it_takes(models):
    assert colours(models["bgr"]) == ["bgr"]
    assert colours(models["rgb"]) == ["rgb"]
    assert colours(models["none"]) == [None]


def test_a_pyacl_without_get_first_aipp_info_loads_the_model_and_says_nothing(models):
    assert colours(models["bgr"], lacks="mdl.get_first_aipp_info") == [None]
