"""An integer input's values against the range the model takes: the range, and the check.

A value outside it is the caller's mistake, refused before the device sees it: there such a
value is an index past a table, which fails the run (a device fault: the instance rebuilt) or,
on CANN's AI Core kernels, reads zeros (a wrong answer), and a negative one may read from the
end of the table. The server answers the refusal 400 (server/values.py), the Python API's Engine
raises it as a ValueError (runtime/engine.py); where the ranges come from is theirs to say
(repository/value_ranges.py: the compile's table sizes and the model's YAML; Engine.load's
value_ranges). Imports only numpy and sits below every package, so both read one check.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np


class ValueRangeError(ValueError):
    """A value range the model cannot take; the message says why."""


@dataclass(frozen=True)
class ValueRange:
    low: int
    high: int
    why: str  # what a refusal adds: where the range comes from


def value_range(name: str, low: int, high: int, inputs: Sequence, why: str) -> ValueRange:
    """`low`..`high` for the model's input `name` (`inputs`: its runtime.types.TensorSpec), or
    ValueRangeError: the model has no such input, it is not an integer one, or a bound is past
    what its type holds (the range would promise values no request can carry, and the model's
    metadata could not say a bound past 64 bits: JSON's encoder refused it, a 500)."""
    specs = {s.name: s for s in inputs}
    spec = specs.get(name)
    if spec is None:
        raise ValueRangeError(f"the model has no input {name!r} (inputs: {', '.join(specs)})")
    if spec.dtype.kind not in "iu":
        raise ValueRangeError(f"input {name} is {spec.datatype}; a value range applies to integer inputs")
    held = np.iinfo(spec.dtype)
    for which, bound in (("smallest", low), ("largest", high)):
        if not held.min <= bound <= held.max:
            raise ValueRangeError(f"{which} {bound} is outside what {spec.datatype} holds ({held.min}..{held.max})")
    return ValueRange(low, high, why)


def table_range(entries: int, dtype: np.dtype) -> tuple[int, int]:
    """The indices of a table of `entries` an input of `dtype` can carry: 0..entries - 1, no more
    than the type holds (a UINT8 input indexing 1,000 entries takes 0..255). One rule for the
    compile that prints the range and the load that checks it."""
    return 0, min(entries - 1, int(np.iinfo(dtype).max))


def out_of_range(arrays: Mapping, ranges: Mapping[str, ValueRange]) -> str | None:
    """The refusal of the first input in `ranges` holding a value outside its range; None when
    every value is inside (an input absent from `arrays`, or empty, holds none)."""
    for name, allowed in ranges.items():
        array = arrays.get(name)
        if array is None or not array.size:
            continue
        low, high = int(array.min()), int(array.max())
        if low < allowed.low or high > allowed.high:
            bad = low if low < allowed.low else high
            return (f"input '{name}': value {bad} is outside {allowed.low}..{allowed.high}, the values the model "
                    f"takes ({allowed.why})")
    return None
