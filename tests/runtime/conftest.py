"""Fixtures: the affine model compiled to a CPU OM, and a started CPU AclRuntime."""
from __future__ import annotations

import pytest
from .runtime_models import affine_onnx

from aclserve.om.compile import compile_model
from aclserve.runtime import AclRuntime


@pytest.fixture
def affine_om(tmp_path):
    def build(batch="1,2,4,8", scale=1.0, name="affine"):
        src = affine_onnx(tmp_path / f"{name}.onnx", scale)
        return str(compile_model(src, tmp_path / f"{name}.om", batch=batch, target="cpu", log=lambda _: None).path)
    return build


@pytest.fixture
def runtime():
    rt = AclRuntime(device="cpu").start()
    yield rt
    rt.close()
