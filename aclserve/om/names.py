"""Output tensor names as ATC writes them into an OM built from ONNX, and back.

An ATC OM reports each output as `<node>:<index>:<onnx tensor name>` (older CANN:
`output_<i>_<node>_<index>`, which no longer carries the tensor name). The CPU OM reports the
first form too, so code written against the CPU runtime meets the names a device reports;
aclserve presents every output to clients under its ONNX tensor name on both runtimes.
"""
from __future__ import annotations

import re

import onnx

_ATC_NAME = re.compile(r"^(?P<node>.*?):(?P<index>\d+):(?P<tensor>.+)$")


def atc_output_name(node: str, index: int, tensor: str) -> str:
    return f"{node}:{index}:{tensor}"


def tensor_name(reported: str) -> str:
    """The ONNX tensor name inside an ATC-style output name; other names come back unchanged."""
    m = _ATC_NAME.match(reported)
    return m.group("tensor") if m else reported


def atc_output_names(model: onnx.ModelProto) -> dict[str, str]:
    """{graph output tensor: ATC-style name} from the node that produces each output. A graph
    output that is a graph input or initializer has no producer and keeps its plain name."""
    out: dict[str, str] = {}
    wanted = {o.name for o in model.graph.output}
    for i, node in enumerate(model.graph.node):
        for index, tensor in enumerate(node.output):
            if tensor in wanted and tensor not in out:
                out[tensor] = atc_output_name(node.name or f"{node.op_type}_{i}", index, tensor)
    return out
