"""Fixtures: the affine model compiled to a CPU OM (the started CPU runtime is tests/conftest.py's)."""
from __future__ import annotations

import pytest

from tests.tiny_models import affine_onnx, compile_cpu_om


@pytest.fixture
def affine_om(tmp_path):
    def build(batch="1,2,4,8", scale=1.0, name="affine"):
        return compile_cpu_om(affine_onnx(tmp_path / f"{name}.onnx", scale), tmp_path / f"{name}.om", batch)
    return build
