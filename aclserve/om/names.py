"""Output tensor names as ATC writes them into an OM built from ONNX, and back.

An ATC OM reports each output as `<node>:<index>:<onnx tensor name>` (older CANN:
`output_<i>_<node>_<index>`, which no longer carries the tensor name). The CPU OM reports the
first form too, so code written against the CPU runtime meets the names a device reports;
aclserve presents every output to clients under its ONNX tensor name on both runtimes.
"""
from __future__ import annotations

import re

import onnx

from .spec import CompileError, graph_inputs

# Either part may hold colons, so the string alone is ambiguous: the tensor is taken as what
# follows the last ":<digits>:". A node name may hold ":1:" (blk:1:relu) and a TF-style tensor
# name ends in ":0", never followed by a colon; a tensor name holding ":<digits>:" or starting
# with "<digits>:" would read back wrong, and is refused at compile (refuse_misread).
_ATC_NAME = re.compile(r"^(?P<node>.*):(?P<index>\d+):(?P<tensor>.+)$")


def atc_output_name(node: str, index: int, tensor: str) -> str:
    return f"{node}:{index}:{tensor}"


def tensor_name(reported: str) -> str:
    """The ONNX tensor name inside an ATC-style output name; other names come back unchanged."""
    m = _ATC_NAME.match(reported)
    return m.group("tensor") if m else reported


def atc_output_names(model: onnx.ModelProto) -> dict[str, str]:
    """{graph output tensor: ATC-style name} from the node that produces each output. ATC's ONNX
    parser names an unnamed node `<op type>_<k>`, k counting the unnamed nodes only
    (AdaptAndFindAllOnnxGraph), and a graph input by its own name (its Data node), so an input
    passed through as an output is `x:0:x`. An initializer passed through keeps its plain name
    here (ATC makes a Const node of it, named otherwise)."""
    out: dict[str, str] = {}
    wanted = {o.name for o in model.graph.output}
    unnamed = 0
    for node in model.graph.node:
        name = node.name
        if not name:
            name, unnamed = f"{node.op_type}_{unnamed}", unnamed + 1
        for index, tensor in enumerate(node.output):
            if tensor in wanted and tensor not in out:
                out[tensor] = atc_output_name(name, index, tensor)
    for graph_input in graph_inputs(model):
        if graph_input.name in wanted and graph_input.name not in out:
            out[graph_input.name] = atc_output_name(graph_input.name, 0, graph_input.name)
    return out


def refuse_misread(model: onnx.ModelProto) -> None:
    """Refuse an output whose device name reads back as another tensor (see _ATC_NAME): it would
    be served under that other name, on the device as on the CPU runtime."""
    for tensor, reported in atc_output_names(model).items():
        if tensor_name(reported) != tensor:
            raise CompileError(f"output {tensor!r} would be reported by the device as {reported!r}, which reads "
                               f"back as {tensor_name(reported)!r}: rename the tensor (one holding ':<digits>:', or "
                               "starting with '<digits>:', cannot be told from its node's name there)")
