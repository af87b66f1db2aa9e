"""The words of a call's inputs refused against the model's: an unknown input, missing ones, a
shape the model does not take, batch rows that differ or are none.

The server's codecs raise them as 400 / INVALID_ARGUMENT (server/codec.py, grpc_codec.py,
bytes_codec.py), `aclserve infer` as its usage error and the Python API's Engine as ValueError
(runtime/engine_inputs.py): one mistake, one wording, whichever door it came through (the
Engine's "unknown input(s) ['zz']; the model takes [...]" and "expected ['N', 4]" said the
server's mistakes otherwise). Below every package, as the runtime may not import the server.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from .quoting import quoted_name, quoted_names


def unknown_input(name: str, model_inputs: Iterable[str]) -> str:
    """`name`: the caller's (quoted and cut as a client's name is); `model_inputs`: the model's."""
    return f"unknown input {quoted_name(name)} (model inputs: {quoted_names(model_inputs)})"


def missing_inputs(names: Iterable[str]) -> str:
    return f"missing input(s): {quoted_names(names)}"


def shape_refused(name: str, shape: list, model_shape: Sequence[int], also: Sequence[int] | None = None) -> str:
    """`model_shape`: -1 for the batch and each open dimension; `also`: another shape the caller
    takes for it (the server's [N, 1] for [N], which the metadata gives: server/model_info.py)."""
    either = "" if also is None else f" or {list(also)}"
    return f"input '{name}': shape {shape} does not match the model's {list(model_shape)}{either}"


def no_rows(name: str) -> str:
    return f"input '{name}': batch dimension must be at least 1"


def rows_differ(name: str, rows: int, others: int) -> str:
    return f"input '{name}': batch size {rows} differs from the other inputs' {others}"
