"""The backend Triton serves a config.pbtxt's model with: the one its `backend` or `platform`
names, or, naming neither, the one Triton fills in from the model file (model_config_utils.cc's
AutoCompleteBackendFields, run before it sets default instance counts): onnxruntime when the
first version folder, by name, holds the .onnx (model.onnx, or the file default_model_filename
names). Triton has no backend for an .om, so it fills none in for one."""
from __future__ import annotations

import os
from pathlib import Path

ONNXRUNTIME = "onnxruntime"


def triton_backend(message, folder: str | os.PathLike) -> str:
    """The backend of the model in `folder` whose config.pbtxt's ModelConfig is `message`: "" for none."""
    if message.backend or message.platform:
        return ONNXRUNTIME if message.backend == ONNXRUNTIME or message.platform == "onnxruntime_onnx" else ""
    try:
        versions = sorted(p for p in Path(folder).iterdir() if p.name.isdigit() and p.is_dir())
    except OSError:
        return ""
    named = message.default_model_filename or "model.onnx"
    return ONNXRUNTIME if versions and named.endswith(".onnx") and (versions[0] / named).is_file() else ""
