"""The values each integer input of a version takes, for the server to refuse the others (400).

Two sources: the compile of a dropped .onnx finds the inputs that index a table of the model
(om/index_bounds.py, kept in the compile cache's manifest), and an input's `value_range` in the
model's YAML sets or overrides a range (an .om compiled elsewhere has only that). An image
input takes pictures, decoded by the server: no range. Checked when the version loads: a range
for an input the model does not have, for a non-integer one, or holding no value of the
input's type fails the load, naming it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ..config import TensorOptions
from ..runtime.types import TensorSpec


class ValueRangeError(ValueError):
    """A configured value_range the model cannot take; the message names the input."""


@dataclass(frozen=True)
class ValueRange:
    low: int
    high: int
    why: str  # what a refusal adds: where the range comes from


def input_ranges(options: Mapping[str, TensorOptions], inputs: Sequence[TensorSpec],
                 index_bounds: Mapping[str, int]) -> dict[str, ValueRange]:
    """{input name: range} from the compile's table sizes, then the config's ranges over them."""
    specs = {s.name: s for s in inputs}
    images = {name for name, opt in options.items() if opt.image is not None}  # pictures in, decoded here
    ranges = {name: ValueRange(0, entries - 1, "it indexes a table of the model")
              for name, entries in index_bounds.items()
              if name in specs and specs[name].dtype.kind in "iu" and name not in images}
    for name, opt in options.items():
        if opt.value_range is None:
            continue
        spec = specs.get(name)
        if spec is None:
            raise ValueRangeError(f"inputs.{name}.value_range: the model has no input {name!r} "
                                  f"(inputs: {', '.join(specs)})")
        if spec.dtype.kind not in "iu":
            raise ValueRangeError(f"inputs.{name}.value_range: input {name} is {spec.datatype}; a value range "
                                  f"applies to integer inputs")
        low, high = opt.value_range
        held = np.iinfo(spec.dtype)
        if high < held.min or low > held.max:  # every request would be refused
            raise ValueRangeError(f"inputs.{name}.value_range: [{low}, {high}] holds no {spec.datatype} value "
                                  f"({held.min}..{held.max})")
        ranges[name] = ValueRange(low, high, "the model's value_range")
    return ranges
