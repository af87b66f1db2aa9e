"""A config.pbtxt's `input` and `output` lists as DeclaredTensors, refused naming the field where
Triton refuses them before it looks at the model (model_config_utils.cc's ValidateIOShape): a
tensor without a name, a data_type or dims, a dimension below 1 (but -1, a variable one), a
data_type Triton has not, a reshape without dims or whose elements are not those of dims (the same
count, and with variable dimensions the same number of them and the same count between each two),
an empty reshape with max_batch_size 0 and both lists given (a tensor of no data). What the model
must match (names, data types, shapes, the number of inputs) is checked when it loads
(repository/declared.py)."""
from __future__ import annotations

from .schema import ConfigError, DeclaredTensor, DeclaredTensors


def declared_tensors(message) -> DeclaredTensors | None:
    """The tensors Triton's ModelConfig `message` lists; None when it lists none."""
    if not (message.input or message.output):
        return None
    # Triton's dims hold the batch dimension too with max_batch_size 0, unless its ONNX Runtime
    # backend completes the config (inputs or outputs not listed) with a batch size (triton_config._batching)
    with_batch = message.max_batch_size == 0 and bool(message.input and message.output)
    inputs = tuple(_declared(t, f"input[{i}]", with_batch) for i, t in enumerate(message.input))
    outputs = tuple(_declared(t, f"output[{i}]", with_batch) for i, t in enumerate(message.output))
    return DeclaredTensors(inputs, outputs, unbatched=message.max_batch_size == 0)


def _declared(tensor, path: str, with_batch: bool) -> DeclaredTensor:
    if not tensor.name:
        raise ConfigError(f"{path}.name", "must be given (Triton refuses a tensor without a name)")
    for field, given in (("data_type", tensor.data_type), ("dims", tensor.dims)):
        if not given:  # (a scalar is dims: [ 1 ] reshape: { shape: [ ] })
            raise ConfigError(f"{path}.{field}", f"must be given for {tensor.name!r} (Triton refuses a tensor "
                                                 f"without {field})")
    dims = _dims(tensor.dims, f"{path}.dims")
    _check_format(tensor, path, dims)
    reshape = None
    if tensor.HasField("reshape"):
        reshape = _dims(tensor.reshape.shape, f"{path}.reshape.shape")
        if _trunks(dims) != _trunks(reshape):
            raise ConfigError(f"{path}.reshape", f"shape {list(reshape)} does not hold the elements of dims "
                                                 f"{list(dims)} (the same count, and the same number of -1 "
                                                 "dimensions with the same count between them; Triton refuses it "
                                                 "too)")
        if not reshape and with_batch:  # (a model without a batch dimension given one list: repository/declared.py)
            raise ConfigError(f"{path}.reshape", "cannot be empty with max_batch_size 0: the tensor would hold no "
                                                 "data (Triton refuses it too)")
    optional = getattr(tensor, "optional", False)  # (an input's field only)
    return DeclaredTensor(tensor.name, _data_type(tensor.data_type, f"{path}.data_type"), dims, reshape, with_batch,
                          optional)


def _dims(values, path: str) -> tuple[int, ...]:
    for value in values:
        if value < 1 and value != -1:
            raise ConfigError(path, f"{list(values)}: a dimension is at least 1, or -1 for a variable one (Triton "
                                    "refuses it too)")
    return tuple(values)


def _check_format(tensor, path: str, dims: tuple[int, ...]) -> None:
    """An input's FORMAT_NCHW or FORMAT_NHWC takes dims of 3 entries, a picture's (Triton's
    ValidateModelInput: "model input NHWC/NCHW require 3 dims"); passed over otherwise."""
    fmt = getattr(tensor, "format", 0)  # (an input's field only)
    if fmt and len(dims) != 3:
        name = type(tensor).Format.Name(fmt) if fmt in type(tensor).Format.values() else str(fmt)
        raise ConfigError(f"{path}.format", f"{name} takes dims of 3 entries (a picture's), not {list(dims)} (Triton "
                                            "refuses it too)")


def _trunks(shape: tuple[int, ...]) -> list[int]:
    """The element counts between a shape's variable dimensions (-1): [2, 4, -1, 6] -> [8, 6]; a
    shape of none, [] (a scalar), holds one element, as [1] does."""
    trunks, count = [], 1
    for dim in shape:
        if dim == -1:
            trunks.append(count)
            count = 1
        else:
            count *= dim
    return trunks + [count]


def _data_type(value: int, path: str) -> str:
    """The KServe name of Triton's DataType `value` (TYPE_STRING: BYTES; TYPE_INVALID, 0, is refused
    as left out before)."""
    from tritonclient.grpc import model_config_pb2  # (imported with the config.pbtxt's reader: triton_config.py)
    types = model_config_pb2.DataType
    if value not in types.values():
        raise ConfigError(path, f"{value} is not one of Triton's data types")
    name = types.Name(value)
    return "BYTES" if name == "TYPE_STRING" else name.removeprefix("TYPE_")
