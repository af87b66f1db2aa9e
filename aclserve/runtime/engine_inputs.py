"""The inputs of a Python API call, checked against the model and copied before it is submitted;
refused in the server's words for the same mistakes (input_refusals.py)."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..dtypes import cast_keeping_values
from ..input_refusals import bool_bytes_refused, missing_inputs, no_rows, rows_differ, shape_refused, unknown_input
from ..value_ranges import ValueRange, out_of_range
from .types import TensorSpec


def checked_inputs(inputs: Mapping[str, np.ndarray], specs: list[TensorSpec],
                   value_ranges: Mapping[str, ValueRange]) -> dict[str, np.ndarray]:
    """A call's `inputs` checked against the model's input `specs` and `value_ranges`, cast and
    copied: {input name: array}, in the model's order. ValueError or TypeError naming what is
    wrong: of several mistakes, the one the server names first for the same request."""
    by_name = {s.name: s for s in specs}
    if not isinstance(inputs, Mapping):
        raise TypeError(f"inputs must be a mapping of input name to array (the model takes "
                        f"{sorted(by_name)}), not {type(inputs).__name__}")
    arrays, rows = {}, None
    # in the order the server checks a request (server/codec.py): each input as the call lists
    # them, unknown, shape and rows, then those missing (missing ones first named another
    # mistake than the server's 400 for the same inputs)
    for name, value in inputs.items():
        spec = by_name.get(name) if isinstance(name, str) else None
        if spec is None:
            if not isinstance(name, str):
                raise TypeError(f"input names are strings, not {type(name).__name__}: {repr(name)[:40]}")
            raise ValueError(unknown_input(name, by_name))
        given = _array(name, value)
        expected = spec.sample_shape if spec.batched else spec.shape
        got = given.shape[1:] if spec.batched else given.shape
        if tuple(got) != tuple(expected) or (spec.batched and given.ndim == 0):  # (before any copy)
            raise ValueError(shape_refused(name, list(given.shape), spec.shape))
        try:
            cast = cast_keeping_values(given, spec.dtype)
        except ValueError as e:
            raise ValueError(f"input {name!r} {e}") from None
        # a copy of its own, in C order: submit() returns before the rows are packed, and the
        # caller may reuse its buffer (np.ascontiguousarray shared it, and made a scalar [1]);
        # a cast made one already
        arr = cast if cast is not given and cast.flags.c_contiguous else np.array(cast, order="C")
        if spec.batched:
            if len(arr) == 0:
                raise ValueError(no_rows(name))
            if rows is not None and len(arr) != rows:
                raise ValueError(rows_differ(name, len(arr), rows))
            rows = len(arr)
        refusal = bool_bytes_refused(name, arr)  # (after the rows, as the server checks them)
        if refusal is not None:
            raise ValueError(refusal)
        arrays[name] = arr
    missing = [s.name for s in specs if s.name not in arrays]
    if missing:
        raise ValueError(missing_inputs(missing))
    refusal = out_of_range(arrays, value_ranges)  # (an index past a table: a device fault, or zeros)
    if refusal is not None:
        raise ValueError(refusal)
    return {s.name: arrays[s.name] for s in specs}


def _array(name: str, value) -> np.ndarray:
    """`value` as an array; a TypeError or ValueError naming the input when it cannot be one (numpy's
    own words named neither the input nor a ragged list, and None passed as a 0-d object array)."""
    if value is None:
        raise TypeError(f"input {name!r} is None, not an array")
    try:
        return np.asarray(value)
    except ValueError as e:  # numpy: "setting an array element with a sequence. ... inhomogeneous shape ..."
        raise ValueError(f"input {name!r} is a ragged nested list (its rows differ in length), not an array: "
                         f"give every row the same shape ({e})") from None
