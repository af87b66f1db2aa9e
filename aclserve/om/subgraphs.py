"""The graphs an ONNX node holds in its attributes: If's branches, Loop's and Scan's bodies (any
operator's GRAPH or GRAPHS attribute), in the attributes' order. The walks of a model that must
reach into them (its operators' domains, data-sized outputs, AIPP's renaming, external data files)
take them here."""
from __future__ import annotations

import onnx


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    found = []
    for attr in node.attribute:
        if attr.HasField("g"):
            found.append(attr.g)
        found.extend(attr.graphs)
    return found
