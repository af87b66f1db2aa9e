"""A config.pbtxt's tensors (config.DeclaredTensors) matched against the model's when a version
loads, as Triton refuses a model its config does not describe: each name listed is one of the
model's, its data_type the model's, and its dims the model's shape, or with a reshape the reshape
is (a dimension the model leaves open, -1, takes any size; one the model fixes takes only that
size, -1 included: Triton's ONNX Runtime backend compares them so), and inputs listed at all are
all the model's (but optional ones). A mismatch fails the load, naming the field and both shapes
(config/triton_tensors.py has refused a reshape not holding the elements of its dims already).

What comes out (TensorViews): the tensors as clients see them, with the config's dims (metadata,
/config and the codec's checks), and the Reshapes that turn a request's tensors into the model's
shapes and the model's outputs into the config's dims, as views (no copy); None without a
reshape, so a model without one pays nothing per request."""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from ..config import PBTXT, DeclaredTensor, DeclaredTensors
from ..runtime.types import TensorSpec


class Reshape:
    """One tensor's reshape: an array of `source` (after its batch rows, when `rows`) becomes one
    of `target`; a variable dimension (-1) of the target takes the size of the source's variable
    ones in order, as Triton maps them."""

    __slots__ = ("source", "target", "rows", "fixed")

    def __init__(self, source: tuple[int, ...], target: tuple[int, ...], rows: bool):
        self.source, self.target, self.rows = source, target, rows
        self.fixed = -1 not in target

    def __call__(self, array):
        lead = array.shape[:1] if self.rows else ()
        if self.fixed:
            return array.reshape(lead + self.target)
        sizes = iter([got for got, dim in zip(array.shape[len(lead):], self.source) if dim == -1])
        return array.reshape(lead + tuple(next(sizes) if dim == -1 else dim for dim in self.target))


class Reshapes:
    """The reshaped inputs and outputs of a version, by name."""

    __slots__ = ("inputs", "outputs")

    def __init__(self, inputs: Mapping[str, Reshape], outputs: Mapping[str, Reshape]):
        self.inputs, self.outputs = dict(inputs), dict(outputs)

    def to_model(self, arrays: Mapping) -> dict:
        """A request's tensors, shaped as the config's dims, in the model's shapes."""
        return {name: self.inputs[name](a) if name in self.inputs else a for name, a in arrays.items()}

    def to_client(self, arrays: Mapping) -> dict:
        """The model's outputs in the config's dims."""
        return {name: self.outputs[name](a) if name in self.outputs else a for name, a in arrays.items()}


@dataclasses.dataclass(frozen=True)
class TensorViews:
    inputs: list[TensorSpec]  # as clients see them (an image input: the model's, images.ImageStage shows BYTES)
    outputs: list[TensorSpec]
    reshapes: Reshapes | None  # None: no tensor is reshaped


def tensor_views(declared: DeclaredTensors | None, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                 with_rows: bool, image_inputs=frozenset(), compiled: bool = False) -> TensorViews | None:
    """The tensors of a model (`with_rows`: compiled with batch sizes, its batched tensors served
    by rows; `compiled`: here, from an .onnx) as `declared` (None: as the model has them). Raises
    ValueError naming the field."""
    if declared is None:
        return None
    reshaped: tuple[dict, dict] = ({}, {})
    views = []
    for kind, listed, specs, reshapes in (("input", declared.inputs, inputs, reshaped[0]),
                                          ("output", declared.outputs, outputs, reshaped[1])):
        by_name = {s.name: s for s in specs}
        for tensor in listed:
            spec = by_name.get(tensor.name)
            if spec is None:
                raise ValueError(_not_the_models(tensor, kind, by_name))
            if tensor.reshape is not None and tensor.name in image_inputs:
                raise ValueError(f"{PBTXT}: input {tensor.name!r} reshape: an image input takes pictures (its "
                                 "model_defaults' image settings), not a tensor to reshape")
            by_name[tensor.name], reshape = _matched(tensor, spec, kind, with_rows, declared.unbatched,
                                                     compiled and kind == "output")
            if reshape is not None:
                reshapes[tensor.name] = reshape
        views.append(list(by_name.values()))
    _count_inputs(declared, inputs)
    return TensorViews(views[0], views[1], Reshapes(*reshaped) if any(reshaped) else None)


def _not_the_models(tensor: DeclaredTensor, kind: str, by_name: Mapping[str, TensorSpec]) -> str:
    """Why a tensor listed is none of the model's. An optional input is, to Triton's ONNX Runtime
    backend, an initializer a request may override; the compile to an OM made it a constant."""
    theirs = f"its {kind}s: {', '.join(by_name)}"
    if tensor.optional:
        return (f"{PBTXT}: input {tensor.name!r} (optional): not an input of the model ({theirs}); an optional input "
                "is an initializer requests may override, and the compile to an OM makes initializers constants: "
                "remove it from input (it can no longer be overridden)")
    return f"{PBTXT}: {kind} {tensor.name!r}: the model has no such {kind} ({theirs}; Triton refuses it too)"


def _count_inputs(declared: DeclaredTensors, inputs: Sequence[TensorSpec]) -> None:
    """Inputs listed at all are all the model's (but those marked optional), as Triton's ONNX
    Runtime backend counts them: a request without the others could not run. An input of the
    model marked optional is counted out too, as there (it means an overridable initializer)."""
    expected = sum(not t.optional for t in declared.inputs)
    if declared.inputs and expected != len(inputs):
        models = {s.name for s in inputs}
        marked = [t.name for t in declared.inputs if t.optional and t.name in models]
        if marked:
            raise ValueError(f"{PBTXT}: input {', '.join(map(repr, marked))} marked optional is an input of the "
                             "model, and optional means an initializer requests may override: remove its "
                             "optional: true (Triton refuses it too, counting it out: configuration expects "
                             f"{expected} inputs, model provides {len(inputs)})")
        missing = [s.name for s in inputs if s.name not in {t.name for t in declared.inputs}]
        raise ValueError(f"{PBTXT}: input lists {expected} inputs (optional ones left out), the model has "
                         f"{len(inputs)}" + (f" (not listed: {', '.join(missing)})" if missing else "")
                         + "; list them all or none (Triton refuses it too: configuration expects "
                           f"{expected} inputs, model provides {len(inputs)})")


def _matched(tensor: DeclaredTensor, spec: TensorSpec, kind: str, with_rows: bool, unbatched: bool,
             sized: bool = False) -> tuple[TensorSpec, Reshape | None]:
    """`spec` as clients see it under `tensor`'s dims, and its Reshape (None without one). A model
    without batch sizes (not `with_rows`) under max_batch_size 0 (`unbatched`) is compared whole,
    whichever lists are given. `sized`: an output the compile of an .onnx gave its sizes (a length
    the inputs' declared dims fix, om/declared_dims.py), which -1 takes: Triton compares the
    .onnx's own, which may leave it variable."""
    where = f"{PBTXT}: {kind} {tensor.name!r}"
    if tensor.data_type != spec.datatype:
        raise ValueError(f"{where} data_type {_triton(tensor.data_type)} is not the model's {_triton(spec.datatype)} "
                         "(Triton refuses it too)")
    rows = with_rows and spec.batched
    if not with_rows and not unbatched:
        return spec, None  # (max_batch_size > 0 on a static model: served.py refuses that)
    if not with_rows and tensor.reshape == ():
        raise ValueError(f"{where} reshape: cannot be empty with max_batch_size 0 on a model without a batch "
                         "dimension: the tensor would hold no data (Triton refuses it too)")
    refused = shape_refused(tensor, kind, spec.shape, rows, unbatched, sized)
    if refused is not None:
        raise ValueError(refused)
    dims, reshape = tensor.dims, tensor.reshape
    if rows and tensor.with_batch:  # max_batch_size 0: both begin with the batch dimension, served as rows
        if dims[0] != -1:  # (Triton would take only that many rows; the batcher serves any number)
            raise ValueError(f"{where} dims {list(dims)}: with max_batch_size 0 the first dimension is the model's "
                             f"batch dimension, served as any number of rows: give -1 there (dims "
                             f"{[-1, *dims[1:]]}), or max_batch_size over 0 and dims {list(dims[1:])}")
        if reshape is not None and reshape[0] != dims[0]:
            raise ValueError(f"{where} reshape {list(reshape)} changes the batch dimension, the first of dims "
                             f"{list(dims)} (max_batch_size 0): aclserve batches the model's rows along it")
        dims, reshape = dims[1:], None if reshape is None else reshape[1:]
    if reshape == dims:
        reshape = None
    client = dataclasses.replace(spec, shape=((-1,) if rows else ()) + dims, reshape=reshape)
    return client, None if reshape is None else Reshape(*((dims, reshape) if kind == "input" else (reshape, dims)),
                                                         rows)


def shape_refused(tensor: DeclaredTensor, kind: str, shape: Sequence[int], rows: bool, unbatched: bool,
                  sized: bool = False) -> str | None:
    """Why `tensor`'s dims (or reshape) do not fit the model's `shape` (-1 for a variable dimension),
    its batch dimension first when `rows` (served by rows: compared after it, unless the config's
    dims hold it too); None when they fit. `unbatched`, `sized`: _matched's. When the two differ by
    the batch dimension alone, the rule is said with what to write: the commonest mistake."""
    whole = tensor.with_batch or not rows  # the model's shape compared whole, batch dimension and all
    model = tuple(shape) if whole else tuple(shape[1:])
    given, field = (tensor.dims, "dims") if tensor.reshape is None else (tensor.reshape, "reshape")
    if _fits(given, model, sized):
        return None
    also = f" (dims {list(tensor.dims)})" if tensor.reshape is not None else ""
    row = "" if whole else " per batch row"
    refused = (f"{PBTXT}: {kind} {tensor.name!r} {field} {list(given)}{also} does not match the model's "
               f"{tensor.name}, {list(model)}{row} (-1 in the model's takes any size; Triton refuses it too)")
    if field != "dims" or not rows:
        return refused
    if not whole and len(given) == len(model) + 1 and _fits(given[1:], model, sized):
        if unbatched:  # (max_batch_size 0 with one list: Triton's backend completes one, as aclserve does)
            return (f"{refused}; max_batch_size 0 with only input or output listed takes the model's batch size, "
                    f"as Triton's ONNX Runtime backend completes it, so dims leave the batch dimension out: write "
                    f"{list(given[1:])}")
        return f"{refused}; max_batch_size > 0: dims leave the batch dimension out: write {list(given[1:])}"
    if whole and len(given) == len(model) - 1 and _fits(given, model[1:], sized):
        return (f"{refused}; max_batch_size 0: dims give the whole shape, the batch dimension too: write "
                f"{[-1, *given]}, or set max_batch_size")
    return refused


def _fits(given: Sequence[int], model: Sequence[int], sized: bool) -> bool:
    """Whether dims `given` fit the model's: -1 in the model's takes any size; -1 given takes one
    only the compile fixed (`sized`)."""
    return len(given) == len(model) and all(m in (-1, g) or (sized and g == -1) for m, g in zip(model, given))


def _triton(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"
