"""The words of a call refused against the model's tensors: an unknown input, missing ones, a
shape the model does not take, batch rows that differ or are none, BOOL bytes other than 0 and 1;
an unknown output, or one asked to classify that cannot be (with the datatypes that can).

The server's codecs raise them as 400 / INVALID_ARGUMENT (server/codec.py, grpc_codec.py,
bytes_codec.py), `aclserve infer` as its usage error and the Python API's Engine as ValueError
(runtime/engine_inputs.py): one mistake, one wording, whichever door it came through (the
Engine's "unknown input(s) ['zz']; the model takes [...]" and "expected ['N', 4]" said the
server's mistakes otherwise, and the Engine passed on BOOL bytes the server refuses). Below every
package, as the runtime may not import the server.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from .quoting import listed_names, quoted_name

# output datatypes whose values can be ranked into classes (Triton refuses the others)
CLASSIFIABLE = frozenset({"INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64", "FP32", "FP64"})
# "value:index" strings a request's classification answers may hold: each costs a few us of the
# event loop and ~200 bytes outside the memory budget (65,536: about 0.2 s and 13 MB at most); the
# server's bound (server/codec.py), and so `aclserve infer`'s on --classification
MAX_CLASSIFICATION_ENTRIES = 65_536


def unknown_input(name: str, model_inputs: Iterable[str]) -> str:
    """`name`: the caller's (quoted and cut as a client's name is); `model_inputs`: the model's."""
    return f"unknown input {quoted_name(name)} (model inputs: {listed_names(model_inputs, quote=True)})"


def missing_inputs(names: Iterable[str]) -> str:
    return f"missing input(s): {listed_names(names, quote=True)}"


def shape_refused(name: str, shape: list, model_shape: Sequence[int], also: Sequence[int] | None = None) -> str:
    """`model_shape`: -1 for the batch and each open dimension; `also`: another shape the caller
    takes for it (the server's [N, 1] for [N], which the metadata gives: server/model_info.py)."""
    either = "" if also is None else f" or {list(also)}"
    return f"input '{name}': shape {shape} does not match the model's {list(model_shape)}{either}"


def no_rows(name: str) -> str:
    return f"input '{name}': batch dimension must be at least 1"


def rows_differ(name: str, rows: int, others: int) -> str:
    return f"input '{name}': batch size {rows} differs from the other inputs' {others}"


def bool_bytes_refused(name: str, arr: np.ndarray) -> str | None:
    """The refusal of a BOOL array holding a byte other than 0 or 1, else None (any other array:
    None). numpy takes such a byte as a bool that is neither: a model casting it reads 2, a Not
    answers 3 (Triton passes them on)."""
    if arr.dtype.kind != "b" or not arr.size or arr.view(np.uint8).max() <= 1:
        return None
    return f"input '{name}': BOOL elements must be the bytes 0 or 1"


def unknown_output(name: str, model_outputs: Iterable[str]) -> str:
    """`name`: the caller's (quoted and cut as a client's name is); `model_outputs`: the model's."""
    return f"unknown output {quoted_name(name)} (model outputs: {listed_names(model_outputs, quote=True)})"


def classification_refused(name: str, datatype: str) -> str:
    """For an output of a `datatype` not in CLASSIFIABLE asked for its classes."""
    return (f"output '{name}': classification is not available for {datatype} outputs "
            f"(only integer, FP32 and FP64 ones, as in Triton)")
