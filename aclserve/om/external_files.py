"""The external data files an ONNX model names (weights kept beside it: models over 2 GB), found
as onnx reads them: from every tensor of its graph and subgraphs, relative to its folder."""
from __future__ import annotations

import os

import onnx


def external_locations(model: onnx.ModelProto) -> set[str]:
    """The external data files `model` names (as written: relative to its folder), from every
    tensor of its graph and subgraphs, as onnx reads them."""
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data
    return {ExternalDataInfo(t).location for t in _tensors(model.graph) if uses_external_data(t)}


def _tensors(graph: onnx.GraphProto):
    """Every tensor of `graph` and its subgraphs: initializers and node attributes."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _tensors(attribute.g)
            for sub in attribute.graphs:
                yield from _tensors(sub)


def missing_external_file(locations: set[str], folder: str) -> str | None:
    """The first of the external data files `locations` that is not there, or None."""
    for location in sorted(locations):
        if "\0" not in location and not os.path.lexists(os.path.join(folder, location)):
            return location
    return None


def external_bytes(locations: set[str], folder: str) -> int:
    """The sizes of the external data files `locations` (those that can be read)."""
    total = 0
    for location in locations:
        try:
            total += os.path.getsize(os.path.join(folder, location))
        except (OSError, ValueError):  # (onnx's own read says why)
            pass
    return total
