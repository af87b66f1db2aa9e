"""A compile refusing what a config.pbtxt gave an .onnx (om/spec.py's resolve), said of that file's
fields, which hold no compile settings: the batch sizes its max_batch_size gave a model without a
batch dimension, and the input dimensions the model leaves variable that its dims do not fix (or
dims the model's shape does not take, which fix none: said as the load says them of a model).
Those are said all at once, each input with what to write for it, as the compile says them: a
transformer's input_ids and attention_mask ([batch, seq] both) were said one at a time, the
second only once the first was fixed and the server started again. A Triton folder without a config
file is told the config.pbtxt way beside the YAML key the compile names (compile.input_shape)."""
from __future__ import annotations

import os

from ..config import PBTXT
from ..om.compile_error import CompileError, NoBatchDimension, OpenDims
from .declared import shape_refused
from .plan import Wanted

EXAMPLE_LENGTH = 16  # what an example dims gives a dimension left variable
_WHY = ("which aclserve cannot serve variable: an .onnx is compiled for fixed sizes, only the batch dimension may "
        "vary")
_EVERY_INPUT = " (every input of the model, as Triton counts them)"
# a Triton folder's other way, which a config.pbtxt beside its version folders gives (its dims size them:
# om/declared_dims.py); told only "compile.input_shape", a YAML key, its user looked for a pbtxt field (t99)
_PBTXT_WAY = ("; or, in a config.pbtxt beside its version folders, max_batch_size over 0 and every input listed "
              "with its data_type and its dims without the batch, each variable one given its size (an FP32 x of "
              '[N, L]: input [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] } ])')


def in_pbtxt_words(error: CompileError, wanted: Wanted) -> CompileError | None:
    """`error` said of `wanted`'s config.pbtxt when it is one of the refusals above and the model's
    config is that file; open dimensions of a Triton folder's model without a config file, said with the
    config.pbtxt way too; else None (the compile's own words stand)."""
    if wanted.config_path() is None and isinstance(error, OpenDims) and _in_version_folder(wanted.file.path):
        return OpenDims(f"{error}{_PBTXT_WAY}", error.open_dims, error.shapes)
    if os.path.basename(wanted.config_path() or "") != PBTXT:
        return None
    cap = wanted.config.batching.batch_cap
    if isinstance(error, NoBatchDimension) and cap:
        return CompileError(f"{PBTXT}: max_batch_size {cap} cannot apply: the model has no batch dimension (no "
                            "input has a dynamic first dimension, so it compiles without batch sizes); set 0 or "
                            "remove it (Triton refuses a max_batch_size over 0 for such a model too)")
    if isinstance(error, OpenDims) and error.open_dims:
        return CompileError(_misshapen(error, wanted) or _open_dims_refused(error.open_dims, wanted))
    return None


def _misshapen(error: OpenDims, wanted: Wanted) -> str | None:
    """The refusal of an input listed with dims the model's shape does not take (another rank: they
    sized nothing, om/declared_dims.py), as the load refuses them once compiled (declared.py), of
    the .onnx's own shape: left open, its dimension is the cause, not the one the compile found."""
    declared = wanted.config.declared
    for tensor in declared.inputs if declared else ():
        shape = error.shapes.get(tensor.name)
        if shape is None:
            continue
        batched = bool(shape) and shape[0] == -1 and (tensor.name, 0) not in {d[:2] for d in error.open_dims}
        refused = shape_refused(tensor, "input", shape, batched, declared.unbatched)
        if refused is not None:
            return refused
    return None


def _open_dims_refused(open_dims: list[tuple[str, int, str | None]], wanted: Wanted) -> str:
    """"config.pbtxt: input 'x' dims [-1] give no fixed length to dimension 1 of the model's x (L),
    which ...; give its length in dims (e.g. dims: [ 16 ])", each input so when there are more."""
    by_input: dict[str, list[tuple[int, str | None]]] = {}
    for name, axis, symbol in open_dims:
        by_input.setdefault(name, []).append((axis, symbol))
    declared = {t.name: t for t in (wanted.config.declared.inputs if wanted.config.declared else ())}
    unlisted = [name for name in by_input if name not in declared]
    told = [_told(name, dims, declared.get(name), unlisted[:1] == [name]) for name, dims in by_input.items()]
    shared = _shared_symbols(by_input)
    if len(told) == 1:
        (what, way), = told
        return f"{PBTXT}: {what}, {_WHY}; {way}{shared}"
    listed = "; ".join(f"{what}: {way}" for what, way in told)
    return f"{PBTXT}: {len(told)} inputs keep dimensions the model leaves variable, {_WHY}: {listed}{shared}"


def _told(name: str, dims: list[tuple[int, str | None]], tensor, first_unlisted: bool) -> tuple[str, str]:
    """(what the pbtxt leaves open of input `name`, what to write there), `tensor` its entry in the
    file's input list (None: not listed; the first such said to list every input)."""
    axes = [str(axis) for axis, _ in dims]
    several = len(axes) > 1
    place = f"dimension{'s' if several else ''} {', '.join(axes[:-1])}{' and ' if several else ''}{axes[-1]}"
    what = f"{place} of the model's {name} ({', '.join(symbol or '?' for _, symbol in dims)})"
    lengths = "lengths" if several else "length"
    if tensor is None:
        every = _EVERY_INPUT if first_unlisted else ""
        return f"input {name!r} is not listed, so nothing fixes {what}", \
            f"list it in input with its {lengths} there in dims{every}"
    field, shape = ("dims", tensor.dims) if tensor.reshape is None else ("reshape", tensor.reshape)
    fixed = [d if d != -1 or (i == 0 and tensor.with_batch) else EXAMPLE_LENGTH for i, d in enumerate(shape)]
    example = f" (e.g. {field}: [ {', '.join(map(str, fixed))} ])" if field == "dims" and fixed != list(shape) else ""
    return f"input {name!r} {field} {list(shape)} give no fixed length to {what}", \
        f"give its {lengths} in {field}{example}"


def _shared_symbols(by_input: dict[str, list[tuple[int, str | None]]]) -> str:
    """"; input_ids and attention_mask share seq: give them one length" for each symbol the model
    gives the open dimensions of more than one input (the compile gives them one size)."""
    holders: dict[str, list[str]] = {}
    for name, dims in by_input.items():
        for _, symbol in dims:
            if symbol and name not in holders.setdefault(symbol, []):
                holders[symbol].append(name)
    said = [f"{', '.join(names[:-1])} and {names[-1]} share {symbol}" for symbol, names in holders.items()
            if len(names) > 1]
    return f"; {'; '.join(said)}: give {'them' if len(said) == 1 else 'each'} one length" if said else ""


def _in_version_folder(path: str) -> bool:
    """Whether the model file `path` is a Triton folder's (<model>/<version>/model.onnx)."""
    return os.path.basename(os.path.dirname(path)).isdigit()
