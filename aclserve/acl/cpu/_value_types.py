"""The element types of an ONNX graph's values, for _safe_division: what the graph declares, else
what ONNX Runtime's operator schemas allow, read backward, else what ONNX's shape inference says.

A CPU OM's graph is ONNX Runtime's optimised one, which declares few types (its inputs' and
initializers') and holds com.microsoft operators (FusedConv, FusedMatMul, Gelu, ...) that ONNX's
shape inference does not know: neither their outputs nor the values computed from them get a
type there. A value's producer names in its schema the types its output may take (FusedConv's T:
float16, float, double; Shape's: int64), and when that type parameter is an input's too, the
output has that input's type: the walk follows it back. Pure functions of the graph and schemas.
"""
from __future__ import annotations

import functools
from collections import ChainMap

NOT_WIDE = 0  # a type that is none of those asked about (onnx.TensorProto.UNDEFINED: no value's type is 0)
_ONNX_DOMAINS = ("", "ai.onnx")
_NAMES = {"tensor(int32)": 6, "tensor(int64)": 7}  # onnx.TensorProto's numbers of the types a walk may find


class Scope:
    """The values one graph sees: its own, then those of the graphs around it (a subgraph's)."""

    def __init__(self, graph, opsets: dict[str, int], outer: Scope | None = None):
        """`opsets`: the model's {domain: version} ("" for ONNX's own)."""
        self.opsets = opsets
        self._types = _declared(graph)
        producers, constants = _producers_and_constants(graph)
        self.types = _over(self._types, outer and outer.types)
        self.producers = _over(producers, outer and outer.producers)  # {value: (its node, which output)}
        self.constants = _over(constants, outer and outer.constants)
        self._read: dict[str, int | None] = {}

    def learn(self, typed_graph) -> None:
        """Take the types of `typed_graph` (this graph after ONNX's shape inference) too."""
        self._types.update(_declared(typed_graph))
        self._read.clear()

    def element_type(self, name: str, wide: frozenset[int]) -> int | None:
        """The element type of value `name` when one of `wide` (onnx.TensorProto numbers), NOT_WIDE
        when it cannot be one of them, None when neither can be told."""
        path: dict[str, None] = {}  # (ordered, and a quick look-up: a walk may be the graph's length)
        answer = None
        while name not in path:  # (a cycle, in a malformed graph, ends as None)
            if name in self.types:
                answer = self.types[name] if self.types[name] in wide else NOT_WIDE
                break
            if name in self._read:
                answer = self._read[name]
                break
            path[name] = None
            step = self._step(name, wide)
            if not isinstance(step, str):
                answer = step
                break
            name = step
        self._read.update((walked, answer) for walked in path)
        return answer

    def element_type_of(self, node, wide: frozenset[int]) -> int | None:
        """element_type of a node whose inputs and output share one type (Div's, Mod's T)."""
        told = [self.element_type(name, wide) for name in (*node.input, *node.output) if name]
        return NOT_WIDE if NOT_WIDE in told else next((t for t in told if t is not None), None)

    def _step(self, name: str, wide: frozenset[int]) -> str | int | None:
        """What the producer of `name` tells of its type: the answer, or the input to follow."""
        node, output = self.producers.get(name, (None, 0))
        if node is None:
            return None
        if node.domain in _ONNX_DOMAINS and node.op_type in ("Cast", "Constant"):
            return _attribute_type(node, wide)
        signature = _signature(node.domain, node.op_type, self.opsets.get(_domain(node.domain), 1))
        if signature is None:
            return None
        outputs, inputs, told = signature
        param = _formal(outputs, output)
        types = told.get(param)
        if types is None:  # (an output past those its schema names)
            return None
        if not types & wide:
            return NOT_WIDE
        if len(types) == 1:
            return next(iter(types))
        same = [given for i, given in enumerate(node.input) if given and _formal(inputs, i) == param]
        return same[0] if same else None


def _over(own: dict, outer: dict | ChainMap | None) -> dict | ChainMap:
    """`own`, then what `outer` holds (a plain dict for the main graph: its look-ups are many)."""
    return own if outer is None else ChainMap(own, outer)


def _attribute_type(node, wide: frozenset[int]) -> int | None:
    """The type a Cast (`to`) or a Constant (its value) gives its output."""
    for attr in node.attribute:
        found = {"to": attr.i, "value": attr.t.data_type, "sparse_value": attr.sparse_tensor.values.data_type,
                 "value_int": 7, "value_ints": 7}.get(attr.name)
        if found is not None:
            return found if found in wide else NOT_WIDE
    return None if node.op_type == "Cast" else NOT_WIDE  # (a Constant of floats or strings)


def _formal(params: tuple[str, ...], index: int) -> str | None:
    """The type string of the formal parameter at `index` (the last one, if variadic ("...T"), takes the rest)."""
    if index < len(params):
        return params[index].lstrip(".")
    return params[-1][3:] if params and params[-1].startswith("...") else None


def _domain(domain: str) -> str:
    return "" if domain in _ONNX_DOMAINS else domain


@functools.cache
def _schemas() -> dict[tuple[str, str], list]:
    """{(domain, operator): its schemas, oldest first}: ONNX's and ONNX Runtime's own, as the
    installed ONNX Runtime registers them; {} when it cannot list them."""
    try:
        from onnxruntime.capi.onnxruntime_pybind11_state import get_all_operator_schema

        found: dict[tuple[str, str], list] = {}
        for schema in sorted(get_all_operator_schema(), key=lambda s: s.since_version):
            found.setdefault((schema.domain, schema.name), []).append(schema)
        return found
    except Exception:  # (an ONNX Runtime without it: ONNX's shape inference alone tells types)
        return {}


@functools.cache
def _signature(domain: str, op_type: str, opset: int) -> tuple | None:
    """(its outputs' type strings, its inputs', {type parameter: the types it allows, as
    onnx.TensorProto numbers (NOT_WIDE for any but those of _NAMES)}) of the operator's schema
    at `opset`, a variadic parameter's string marked "...", or None without a schema."""
    schema = next((s for s in reversed(_schemas().get((_domain(domain), op_type), [])) if s.since_version <= opset),
                  None)
    if schema is None:
        return None

    def strings(params) -> tuple[str, ...]:
        return tuple(("..." if p.option.name == "Variadic" else "") + p.typeStr for p in params)

    told = {tc.type_param_str: frozenset(_NAMES.get(t, NOT_WIDE) for t in tc.allowed_type_strs)
            for tc in schema.type_constraints}
    for param in (*strings(schema.inputs), *strings(schema.outputs)):  # (a fixed type: "tensor(int64)")
        told.setdefault(param.lstrip("."), frozenset({_NAMES.get(param.lstrip("."), NOT_WIDE)}))
    return strings(schema.outputs), strings(schema.inputs), told


def _declared(graph) -> dict[str, int]:
    types = {t.name: t.data_type for t in graph.initializer}
    for vi in (*graph.input, *graph.output, *graph.value_info):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


def _producers_and_constants(graph) -> tuple[dict, dict]:
    """({value: (the node computing it, which of its outputs)}, {name: TensorProto}) of `graph`:
    the second, of its initializers and Constant nodes (`value`) whose values it holds (not those
    whose bytes are elsewhere: the large ones the session gets as views)."""
    fed = {vi.name for vi in graph.input}  # (an initializer listed as an input too: a run may feed another value)
    constants = {t.name: t for t in graph.initializer if t.data_location != 1 and t.name not in fed}  # (1: EXTERNAL)
    producers = {}
    for node in graph.node:
        for output, name in enumerate(node.output):
            producers[name] = node, output
        if node.op_type == "Constant" and node.domain in _ONNX_DOMAINS and node.output:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                constants[node.output[0]] = value
    return producers, constants
