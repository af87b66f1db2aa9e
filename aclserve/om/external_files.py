"""The external data files an ONNX model names (weights kept beside it: models over 2 GB), found
as onnx reads them: from every tensor of its graph and subgraphs, relative to its folder."""
from __future__ import annotations

import os
import re

import onnx

from .subgraphs import subgraphs


def external_locations(model: onnx.ModelProto) -> set[str]:
    """The external data files `model` names (as written: relative to its folder), from every
    tensor of its graph and subgraphs, as onnx reads them. ValueError (one line, naming the tensor
    and the entry) for an entry onnx refuses: an offset or length that is not a non-negative integer."""
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data
    locations = set()
    for tensor in _tensors(model.graph):
        if uses_external_data(tensor):
            try:
                locations.add(ExternalDataInfo(tensor).location)
            except ValueError as e:  # (onnx's "invalid literal for int()" names neither tensor nor entry)
                raise ValueError(_bad_entry(tensor) or str(e)) from None
    return locations


def _bad_entry(tensor: onnx.TensorProto) -> str | None:
    """What is wrong with `tensor`'s external data entries, as onnx reads them (the last of a key wins)."""
    entries = {entry.key: entry.value for entry in tensor.external_data}
    for key in ("offset", "length"):
        if key not in entries:
            continue
        try:
            if int(entries[key]) >= 0:
                continue
        except ValueError:
            pass
        value = entries[key] if len(entries[key]) <= 40 else entries[key][:40] + "..."
        name = tensor.name if len(tensor.name) <= 80 else tensor.name[:80] + "..."
        return f"tensor {name!r}: its {key} {value!r} is not a non-negative integer"
    return None


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
        for sub in subgraphs(node):
            yield from _tensors(sub)


def missing_external_file(locations: set[str], folder: str) -> str | None:
    """The first of the external data files `locations` that is not there, or None."""
    for location in sorted(locations):
        if "\0" not in location and not os.path.lexists(os.path.join(folder, location)):
            return location
    return None


# onnx 1.23's refusal of a linked external data file (its checker and its loader, as a safeguard against a
# link attack): "Data of TensorProto ... should be stored in <path>, but it has multiple hard links, ..."
_LINK_REFUSED = re.compile(r"should be stored in (?P<path>.+), but it (?:(?P<hard>has multiple hard links)"
                           r"|is a symbolic link)")


def link_refusal(error: BaseException) -> str | None:
    """What onnx's refusal of a linked external data file means, as a model's reason says it, or
    None for another error: onnx called it "invalid ONNX graph ... a potential hardlink attack",
    and the repository's docs recommend links for model files (not for these)."""
    found = _LINK_REFUSED.search(str(error))
    if found is None:
        return None
    link = "a hard link (a file with more than one name)" if found["hard"] else "a symbolic link"
    return (f"its external data file {os.path.basename(found['path'])} is {link}, which onnx's checker refuses "
            "as a safeguard against link attacks: copy the file there instead")


def external_bytes(locations: set[str], folder: str) -> int:
    """The sizes of the external data files `locations` (those that can be read)."""
    total = 0
    for location in locations:
        try:
            total += os.path.getsize(os.path.join(folder, location))
        except (OSError, ValueError):  # (onnx's own read says why)
            pass
    return total
