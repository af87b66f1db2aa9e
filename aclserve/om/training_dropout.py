"""A Dropout left in training mode: its training_mode input (opset 12 on) a constant true, so every
run drops a random share of its values (its ratio, 0.5 unless given) and scales the rest up.
PyTorch's torch.onnx.export of a model not put in model.eval(), or with
training=TrainingMode.TRAINING, writes it so (a Constant node), and it compiled silently (a
tester, t96). An NPU's Dropout in training mode drops at random (CANN's operator docs); the CPU
compile's ONNX Runtime removes a Dropout whose mask goes unused whatever its mode (its
EliminateDropout), so the CPU runtime answered as in eval mode, and at random where the mask is an
output: neither is the model as written. The rows check could not say so: it runs what the
optimiser left, or judges no output that changes from run to run, as a sampling model's
(RandomNormal, Bernoulli, Multinomial: random on purpose, and compiled).

Refused on both targets, before anything runs (a model that drops out on purpose as it serves,
Monte-Carlo dropout, is told to write its mask with RandomUniformLike, a sampling op: a reviewer).
Only a value the graph fixes counts: an initializer (not one a run may feed: listed as an input
too) or a Constant node, reached through Identity and Cast to bool; a constant ratio of 0 drops
nothing. Before opset 12 Dropout has no such input: ONNX Runtime runs opsets 7 to 11's as a copy
of its input, and has no kernel for earlier ones.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from .spec import CompileError
from .subgraphs import subgraphs

_ONNX_DOMAINS = ("", "ai.onnx")
_CONSTANT_VALUE_ATTRIBUTES = ("value", "value_int", "value_float", "value_ints", "value_floats")


def refuse_training_dropout(model: onnx.ModelProto) -> None:
    """Raise CompileError naming the first Dropout (in the graph or a subgraph) in training mode."""
    found = _training_dropouts(model.graph, {}, {})
    if not found:
        return
    named = f"Dropout node {found[0].name!r}" if found[0].name else f"a Dropout node (output {found[0].output[0]!r})"
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    raise CompileError(f"{named}{more} is in training mode: every answer would be dropped out at random; the usual "
                       "cause is an export without model.eval() (torch.onnx.export(..., "
                       "training=TrainingMode.TRAINING)); export it again after model.eval() (a model meant to drop "
                       "out as it serves, Monte-Carlo dropout, writes its mask with RandomUniformLike, which compiles "
                       "as a sampling model: its answers vary from run to run)")


def _training_dropouts(graph: onnx.GraphProto, outer_constants: dict, outer_producers: dict) -> list[onnx.NodeProto]:
    """The Dropout nodes of `graph` and its subgraphs whose training_mode is a constant true; a
    subgraph sees its outer graphs' values (an If's branch may read the main graph's Constant)."""
    fed = {vi.name for vi in graph.input}  # (an initializer listed as an input too: a run may feed another value)
    constants = {**outer_constants, **{t.name: t for t in graph.initializer if t.name not in fed}}
    producers = dict(outer_producers)
    # (a name fed or computed here hides an outer graph's value of that name)
    for name in fed:
        constants.pop(name, None)
        producers.pop(name, None)
    for node in graph.node:
        for name in node.output:
            producers[name] = node
            constants.pop(name, None)
    found = []
    for node in graph.node:
        if node.op_type == "Dropout" and node.domain in _ONNX_DOMAINS and len(node.input) > 2 and node.input[2]:
            ratio = _value(node.input[1], constants, producers) if node.input[1] else None
            if _value(node.input[2], constants, producers) is True and ratio is not False:
                found.append(node)
        for inner in subgraphs(node):
            found += _training_dropouts(inner, constants, producers)
    return found


def _value(name: str, constants: dict, producers: dict) -> bool | None:
    """Whether `name` is a constant that is nonzero (True) or zero (False): an initializer or a
    Constant node's single value, through Identity and Cast to bool; None when the graph does not say."""
    for _ in range(len(producers) + 1):  # (each step goes one node up; a graph has no cycle)
        if name in constants:
            return _nonzero(constants[name])
        node = producers.get(name)
        if node is None or node.domain not in _ONNX_DOMAINS:
            return None
        if node.op_type == "Constant":
            return _constant_node_value(node)
        if not _passes_truth(node):
            return None
        name = node.input[0]
    return None


def _passes_truth(node: onnx.NodeProto) -> bool:
    """Whether `node` gives whether its first input is 0 unchanged: an Identity, a Cast to bool (a
    Cast to int of 0.5 gives 0)."""
    if not node.input:
        return False
    return node.op_type == "Identity" or node.op_type == "Cast" and any(
        a.name == "to" and a.i == onnx.TensorProto.BOOL for a in node.attribute)


def _constant_node_value(node: onnx.NodeProto) -> bool | None:
    for attr in node.attribute:
        if attr.name in _CONSTANT_VALUE_ATTRIBUTES:
            value = onnx.helper.get_attribute_value(attr)
            return _nonzero(value if isinstance(value, onnx.TensorProto) else np.array(value))
    return None


def _nonzero(value) -> bool | None:
    """A scalar's (or one-element tensor's) truth, `value` a TensorProto or an array; None for
    another size or for bytes not in the model (external data: ATC's compile leaves them unread)."""
    if isinstance(value, onnx.TensorProto):
        if value.data_location == onnx.TensorProto.EXTERNAL:
            return None
        value = numpy_helper.to_array(value)
    return bool(value.reshape(-1)[0]) if value.size == 1 else None
