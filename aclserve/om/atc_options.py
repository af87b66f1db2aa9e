"""What ATC takes of the options a compile records, so that a CPU OM is not built from what ATC
would refuse (an independent tester compiled `--precision-mode bogus`, `--soc-version Bogus123`
and opsets 7 and 28 without a word, and com.microsoft and ai.onnx.ml operators).

--precision_mode has a documented list of values: any other is refused on both targets (its check is
shape_args.py's, which the config's reader makes too, without onnx). The SoCs and opsets ATC takes
depend on the CANN installed (an OPP per SoC; ONNX opsets 11 in CANN 5.0/6.0, 11-15 in 8.0, 11-18
in the newest), so a CPU compile is warned, not refused: ATC itself judges them on the NPU path.
CANN's ONNX op plugins register parsers for opsets 8 to 10 too for many operators (Conv:
"ai.onnx::8::Conv" to "ai.onnx::18::Conv"), though its documents say 11: those "may" be refused.

ATC looks an operator's parser up by "domain::opset::type", and CANN's plugins register them under
"ai.onnx" alone: an operator of another domain (com.microsoft's contrib operators, which ONNX
Runtime's transformer optimiser writes; ai.onnx.ml's, which skl2onnx writes) fails ATC with E19010
"No parser is registered for Op" unless a custom op plugin on that host parses it. The CPU compile
refuses such a source model (the device would); ONNX Runtime's own optimiser, which runs after
this check, fuses into com.microsoft operators that never reach a device.
"""
from __future__ import annotations

import re

import onnx
from onnx import shape_inference

from ..quoting import listed_names
from .spec import CompileError
from .subgraphs import subgraphs

OPSETS = (11, 18)  # the newest CANN's ONNX opsets, both ends included
PLUGIN_OPSETS = 8  # the oldest opset CANN's ONNX op plugins register parsers for (many operators)
ONNX_DOMAINS = ("", "ai.onnx")  # ONNX's own, which ATC's parsers are registered under ("ai.onnx::11::Conv")
SHOWN_OPERATORS = 3  # the foreign operators a refusal names
FP32 = onnx.TensorProto.FLOAT  # what precision modes lower
# ONNX's floating-point tensor types (complex ones hold floats too)
FLOATING_POINT = frozenset(getattr(onnx.TensorProto, name) for name in (
    "FLOAT", "FLOAT16", "BFLOAT16", "DOUBLE", "COMPLEX64", "COMPLEX128", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ",
    "FLOAT8E5M2", "FLOAT8E5M2FNUZ") if hasattr(onnx.TensorProto, name))
# `Ascend` + the chip's name from npu-smi (Ascend310, Ascend310P3, Ascend310B1, Ascend910B3, ...)
_SOC_NAME = re.compile(r"Ascend[0-9]{3}[0-9A-Za-z_-]*")


def cpu_warnings(model: onnx.ModelProto, soc_version: str | None) -> list[str]:
    """What ATC would refuse (or may) among what a CPU compile records: its SoC and the model's
    ONNX opset. One line each, for the compile's summary."""
    warnings = []
    if soc_version is not None and not _SOC_NAME.fullmatch(soc_version):
        warnings.append(f"--soc-version {soc_version!r} does not look like a SoC ATC takes (`Ascend` and the "
                        "chip's name from npu-smi, e.g. Ascend310P3, Ascend910B1): ATC would refuse it")
    opset = next((o.version for o in model.opset_import if o.domain in ONNX_DOMAINS), None)
    if opset is not None and PLUGIN_OPSETS <= opset < OPSETS[0]:
        warnings.append(f"the model imports ONNX opset {opset}; ATC may refuse it: CANN documents opsets {OPSETS[0]} "
                        f"to {OPSETS[1]}, though its parsers take opset {opset} for many operators; convert it "
                        "(onnx.version_converter) to be sure")
    elif opset is not None and not OPSETS[0] <= opset <= OPSETS[1]:
        warnings.append(f"the model imports ONNX opset {opset}; ATC takes opsets {OPSETS[0]} to {OPSETS[1]} (older "
                        "CANN fewer: 8.0 takes 11 to 15): ATC would refuse it; convert it (onnx.version_converter)")
    return warnings


def floating_point_types(model: onnx.ModelProto) -> frozenset[int]:
    """The floating-point types (onnx.TensorProto's) of the tensors an operator of the model (or of
    its subgraphs) takes or gives: what precision modes are about on an NPU (FP32 is what they lower;
    FP16 inputs, what force_fp32 computes in fp32), which the CPU runtime computes in the model's own
    types. The compile's precision note names FP32 operators only for a model that has some, and
    says that answers may differ only for one that has any: none of an INT32 model's types is one a
    precision mode changes. What the graph declares is read first; shape inference's types only when
    that finds no FP32 (an INT32 or an FP16 model)."""
    declared = _declared(model.graph)
    if FP32 in declared:
        return declared
    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # (the compile says what is wrong with the model; unknown here: said as before)
        return declared | {FP32}
    return declared | _declared(inferred.graph)


def _declared(graph: onnx.GraphProto) -> frozenset[int]:
    """The floating-point types among the graph's inputs, outputs, typed values, weights, constants
    and casts, its subgraphs' included."""
    found = {v.type.tensor_type.elem_type for v in list(graph.input) + list(graph.output) + list(graph.value_info)}
    found.update(t.data_type for t in graph.initializer)
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                found.add(attribute.t.data_type)  # (a Constant's value)
            if node.op_type == "Cast" and attribute.name == "to":
                found.add(attribute.i)
        for sub in subgraphs(node):
            found.update(_declared(sub))
    return frozenset(found & FLOATING_POINT)


def refuse_foreign_operators(model: onnx.ModelProto) -> None:
    """Raise CompileError for a source model holding operators of a domain other than ONNX's,
    in its graph or in the subgraphs of If, Loop and Scan: ATC has no parser for them (E19010)."""
    foreign: dict[tuple[str, str], None] = {}  # (domain, type), in the order met
    for node in _nodes(model.graph):
        if node.domain not in ONNX_DOMAINS:
            foreign.setdefault((node.domain, node.op_type))
    if not foreign:
        return
    shown = listed_names((f"{domain}:{op}" for domain, op in foreign), SHOWN_OPERATORS)
    raise CompileError(f"the model uses operators outside the ONNX domain ({shown}), for which ATC has no "
                       "parser (E19010 \"No parser is registered for Op\"), so the CPU compile refuses them too: "
                       "export the model again without contrib or ML operators (ONNX Runtime's transformer "
                       "optimiser writes com.microsoft ones, skl2onnx ai.onnx.ml ones), or compile it with ATC on "
                       "an NPU host that has a custom op plugin for them")


def _nodes(graph: onnx.GraphProto):
    """The graph's nodes and, depth first, those of its subgraphs (If's branches, Loop's and Scan's bodies)."""
    for node in graph.node:
        yield node
        for sub in subgraphs(node):
            yield from _nodes(sub)
