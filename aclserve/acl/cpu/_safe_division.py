"""Integer divisions that cannot end the process: the ONNX model a session is built from, with
each Div and Mod that could trap rewritten into one that cannot.

ONNX Runtime's Div and Mod kernels divide with the CPU's own instruction, and x86's traps on
INT_MIN / -1 (the quotient does not fit): the process dies of SIGFPE, which Python cannot catch,
and every model and request of the server goes with it (found by a tester: one request did it).
On a device the host process would live on. Measured on plain ORT, one subprocess per case, on
ten releases from 1.17.3 to 1.32.0: Div of INT32 or INT64 traps in every one; Mod with fmod=0
traps on them up to 1.31.1 (1.32.0 answers 0); Mod with fmod=1 (std::fmod, in double) does not,
nor does an 8- or 16-bit type (promoted to int) or an unsigned one (no -1). No other kernel tried
on 1.32.0 traps on its inputs' values (Range, Reshape, ReduceMean of an empty axis, Expand, Tile,
Pad, OneHot, Slice, Split, Resize). A division by zero is ORT's own failed run from 1.25.0 on
(1.24.4 and older trap on it too) and is left to it: the rewritten node still divides by that zero.

The rewrite gives what two's complement wrapping gives (INT_MIN / -1 = INT_MIN, INT_MIN % -1 =
0), with ops that wrap rather than trap, and keeps the node's name and output:

    hit2 = 2 * Cast(Equal(b, -1))         2 where b is -1, else 0
    q = Div(a, b + hit2)                  divides by 1 where b was -1
    y = q - q * hit2                      -q there (wrapping), q elsewhere
    y = Mod(a, b + hit2)                  (fmod=0; a % 1 = a % -1 = 0)

(opset 7 ops only, as ORT takes no older model). Types are what the graph declares, else what
ONNX Runtime's operator schemas allow (an optimised graph's com.microsoft operators are unknown
to ONNX), else what ONNX's shape inference finds (_value_types); a node whose type none tells is
left as it is and named in a warning, and one whose divisor is a constant without -1 is left too.
A model whose bytes name no Div or Mod is returned as it is, not parsed, and one with nothing to
rewrite as it came, not written out again.
"""
from __future__ import annotations

import itertools
import logging

from ...om.subgraphs import subgraphs
from ._value_types import NOT_WIDE, Scope

log = logging.getLogger("aclserve.acl.cpu")

_TRAPPING = frozenset({6, 7})  # onnx.TensorProto.INT32, INT64: the types whose division traps
_ONNX_DOMAINS = ("", "ai.onnx")
# NodeProto.op_type (field 4, 3 bytes) as protobuf writers encode it: a model without either has no such node
_MARKS = (b'"\x03Div', b'"\x03Mod')


def rewritten(model: bytes) -> bytes:
    """`model` (a serialised ONNX model) with its trapping Div and Mod nodes rewritten, in its
    graph, its subgraphs and its local functions; the same bytes when there are none."""
    if not any(mark in model for mark in _MARKS):
        return model
    import onnx  # deferred: a heavy import, for models with a Div or Mod only

    try:
        proto = onnx.ModelProto.FromString(model)
    except Exception:  # (not a model: ORT, given the bytes, says what is wrong)
        return model
    try:
        return _rewritten(proto) or model
    except Exception as e:  # (a graph this reading did not foresee: it runs as it came, as before)
        log.warning("the integer divisions of a model could not be made safe (%s: %s): an INT32 or INT64 division of "
                    "its minimum by -1 there would end the process", type(e).__name__, e)
        return model


def _rewritten(proto) -> bytes | None:
    """The model serialised again with its trapping divisions rewritten, None when it has none."""
    from onnx import shape_inference

    if any(_divides(function.node) for function in proto.functions):
        from onnx import inliner  # (ORT inlines them too, where their types are known)

        proto = inliner.inline_local_functions(proto)
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in proto.opset_import}
    scopes: list[Scope] = []  # (every graph's, in the order _graphs gives them)
    found = _divisions(proto.graph, opsets, None, scopes)
    if not found:
        return None
    types = [scope.element_type_of(node, _TRAPPING) for graph, index, node, scope in found]
    if None in types:  # (the schemas could not tell: ONNX's shape inference may)
        try:
            typed_graphs = _graphs(shape_inference.infer_shapes(proto, strict_mode=False).graph)
        except Exception as e:
            log.info("ONNX shape inference failed on a model with Div or Mod nodes: %s", e)
            typed_graphs = []
        if len(typed_graphs) == len(scopes):  # (the same graphs, in the same order)
            for scope, typed_graph in zip(scopes, typed_graphs):
                scope.learn(typed_graph)
            types = [scope.element_type_of(node, _TRAPPING) for graph, index, node, scope in found]
    unknown = [node.name or node.output[0] for (_, _, node, _), elem_type in zip(found, types) if elem_type is None]
    if unknown:
        log.warning("Div or Mod node(s) %s: their element type is not known, so they are left as they are "
                    "(an INT32 or INT64 division of its minimum by -1 there would end the process)",
                    ", ".join(repr(name) for name in unknown[:5]))
    if not set(types) - {None, NOT_WIDE}:
        return None
    made = _Made(_names(proto.graph))
    replaced: dict[int, tuple] = {}  # id(graph) -> (graph, {node index: its nodes})
    for (graph, index, node, _), elem_type in zip(found, types):
        if elem_type not in (None, NOT_WIDE):
            replaced.setdefault(id(graph), (graph, {}))[1][index] = made.safe(node, elem_type)
    for graph, nodes in replaced.values():
        rebuilt = [made_node for i, n in enumerate(graph.node) for made_node in nodes.get(i, [n])]
        del graph.node[:]
        graph.node.extend(rebuilt)  # (each in the place of its division: the graph stays topologically sorted)
    return proto.SerializeToString()


def _divides(nodes) -> bool:
    return any(n.op_type in ("Div", "Mod") and n.domain in _ONNX_DOMAINS or any(
        _divides(g.node) for g in subgraphs(n)) for n in nodes)


def _graphs(graph) -> list:
    """`graph` and its subgraphs, depth first in node order."""
    return [graph] + [inner for node in graph.node for sub in subgraphs(node) for inner in _graphs(sub)]


def _divisions(graph, opsets: dict[str, int], outer: Scope | None, scopes: list[Scope]) -> list[tuple]:
    """(graph, node index, node, scope) of each Div and Mod of `graph` and its subgraphs that may
    trap whatever its type: Mod with fmod=1 never does (std::fmod, in double), nor a division by a
    constant without -1. Appends each graph's scope to `scopes`, in _graphs' order."""
    scope = Scope(graph, opsets, outer)
    scopes.append(scope)
    found = []
    for index, node in enumerate(graph.node):
        if node.op_type in ("Div", "Mod") and node.domain in _ONNX_DOMAINS and len(node.input) == 2 \
                and not any(a.name == "fmod" and a.i == 1 for a in node.attribute) \
                and _may_be_minus_one(node.input[1], scope.constants):
            found.append((graph, index, node, scope))
        for sub in subgraphs(node):
            found += _divisions(sub, opsets, scope, scopes)
    return found


def _may_be_minus_one(name: str, constants) -> bool:
    if name not in constants:
        return True
    from onnx import numpy_helper

    try:
        return bool((numpy_helper.to_array(constants[name]) == -1).any())
    except Exception:  # (a tensor numpy_helper cannot read: as if it held -1)
        return True


def _names(graph) -> set[str]:
    """Every value and node name of `graph` and its subgraphs (those the new names must avoid)."""
    found = {vi.name for vi in (*graph.input, *graph.output, *graph.value_info)}
    found.update(t.name for t in graph.initializer)
    for node in graph.node:
        found.update((*node.input, *node.output, node.name))
        for sub in subgraphs(node):
            found |= _names(sub)
    return found


class _Made:
    """The nodes that replace a trapping division, with names no other value of the model has."""

    def __init__(self, taken: set[str]):
        self._taken = taken

    def _name(self, base: str) -> str:
        name = next(name for k in itertools.count() if (name := f"{base}_aclserve_safe_{k}") not in self._taken)
        self._taken.add(name)
        return name

    def safe(self, node, elem_type: int) -> list:
        """The nodes that replace `node` (a Div or Mod of `elem_type`)."""
        from onnx import helper

        a, b = node.input
        out = node.output[0]
        minus_one, hit, hit_int, hit2, divisor = (self._name(f"{out}_{part}") for part in (
            "minus_one", "is_minus_one", "is_minus_one_int", "twice", "divisor"))
        made = [helper.make_node("Constant", [], [minus_one], value=helper.make_tensor("", elem_type, [], [-1])),
                helper.make_node("Equal", [b, minus_one], [hit]),
                helper.make_node("Cast", [hit], [hit_int], to=elem_type),
                helper.make_node("Add", [hit_int, hit_int], [hit2]),
                helper.make_node("Add", [b, hit2], [divisor])]
        division = type(node)()
        division.CopyFrom(node)
        division.input[1] = divisor
        if node.op_type == "Mod":
            return made + [division]
        quotient, flipped = self._name(f"{out}_quotient"), self._name(f"{out}_flipped")
        division.output[0] = quotient
        return made + [division, helper.make_node("Mul", [quotient, hit2], [flipped]),
                       helper.make_node("Sub", [quotient, flipped], [out])]
