"""Check a model file before anything is unloaded for it: magic, header, length, payload.

Runs in a worker thread (it reads the file). Raises InvalidModelFile with a reason fit for the
repository index; returns the kind ("cpu_om" | "atc_om") otherwise.
"""
from __future__ import annotations

import os

from ..om import atc_om, container


class InvalidModelFile(ValueError):
    """The file is not a loadable OM for the active runtime; the message says why."""


def validate_om(path: str | os.PathLike, runtime_kind: str) -> str:
    """Validate `path` for the runtime kind "cpu" or "npu" (blocking)."""
    try:
        kind, header = atc_om.identify(path)
        if kind == "cpu_om":
            # checksum (catches same-length corruption), read in chunks: the model is not held twice
            container.verify_payload_file(path, header)
    except FileNotFoundError:
        raise InvalidModelFile("the file disappeared") from None
    except OSError as e:
        raise InvalidModelFile(f"cannot read the file: {e.strerror}") from None
    except container.OmFormatError as e:
        raise InvalidModelFile(str(e)) from None
    if kind == "cpu_om" and runtime_kind == "npu":
        raise InvalidModelFile("a CPU OM cannot run on an NPU; compile the ONNX with ATC")
    if kind == "atc_om" and runtime_kind == "cpu":
        raise InvalidModelFile("an ATC OM needs CANN and an Ascend device; "
                               "the CPU runtime loads CPU OMs (aclserve compile --target cpu)")
    if kind == "om2":
        raise InvalidModelFile("OM2 (zip) models are not supported")
    return kind
