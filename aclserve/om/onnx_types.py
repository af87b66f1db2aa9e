"""An ONNX value's type written as ONNX Runtime writes it (`seq(tensor(float))`,
`optional(tensor(int64))`, `map(string,tensor(float))`), and what to do with one that is not a
tensor: a refusal said "is not a tensor" without the type it found (a tester, t85). Pure functions."""
from __future__ import annotations

import onnx

# the operators that make a value of each kind from a tensor input, and a tensor output from one
_FROM_A_TENSOR = {"sequence_type": "SplitToSequence", "optional_type": "Optional"}
_TO_A_TENSOR = {"sequence_type": "ConcatFromSequence or SequenceAt", "optional_type": "OptionalGetElement"}


def type_name(t: onnx.TypeProto) -> str:
    """`t` as ONNX Runtime names it; `?` for what the model leaves unsaid."""
    kind = t.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        return f"{kind[:-len('_type')]}({_element(getattr(t, kind).elem_type)})"
    if kind == "sequence_type":
        return f"seq({type_name(t.sequence_type.elem_type)})"
    if kind == "optional_type":
        return f"optional({type_name(t.optional_type.elem_type)})"
    if kind == "map_type":
        return f"map({_element(t.map_type.key_type)},{type_name(t.map_type.value_type)})"
    if kind == "opaque_type":
        return f"opaque({'.'.join(part for part in (t.opaque_type.domain, t.opaque_type.name) if part)})"
    return kind or "?"


def not_a_tensor(what: str, vi: onnx.ValueInfoProto) -> str:
    """The refusal of an input or output (`what`) whose type is not a tensor: its type and the way out."""
    kind = vi.type.WhichOneof("value")
    way = (_FROM_A_TENSOR if what == "input" else _TO_A_TENSOR).get(kind)
    make = f" (e.g. with {way} in the model)" if way else ""
    return (f"{what} {vi.name!r} has type {type_name(vi.type)}, not a tensor: aclserve, as KServe v2 and ATC, "
            f"serves tensors only; give the model a tensor {what} in its place{make}")


def _element(elem_type: int) -> str:
    try:
        return onnx.TensorProto.DataType.Name(elem_type).lower() if elem_type else "?"
    except ValueError:  # (a number no onnx release names)
        return str(elem_type)
