"""The values each integer input of a version takes, for the server to refuse the others (400).

Two sources: the compile of a dropped .onnx finds the inputs that index a table of the model
(om/index_bounds.py, kept in the compile cache's manifest), and an input's `value_range` in the
model's YAML sets or overrides a range (an .om compiled elsewhere has only that). An image
input takes pictures, decoded by the server: no range. Checked when the version loads: a range
for an input the model does not have, for a non-integer one, or with a bound past what the
input's type holds fails the load, naming it. The range and the check itself: ../value_ranges.py.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..config import TensorOptions
from ..runtime.types import TensorSpec
from ..value_ranges import ValueRange, ValueRangeError, value_range


def input_ranges(options: Mapping[str, TensorOptions], inputs: Sequence[TensorSpec],
                 index_bounds: Mapping[str, int]) -> dict[str, ValueRange]:
    """{input name: range} from the compile's table sizes, then the config's ranges over them."""
    specs = {s.name: s for s in inputs}
    images = {name for name, opt in options.items() if opt.image is not None}  # pictures in, decoded here
    # (capped to what the input's type holds: a UINT8 input indexing a table of 1,000 takes 0..255)
    ranges = {name: ValueRange(0, min(entries - 1, int(np.iinfo(specs[name].dtype).max)),
                               "it indexes a table of the model")
              for name, entries in index_bounds.items()
              if name in specs and specs[name].dtype.kind in "iu" and name not in images}
    for name, opt in options.items():
        if opt.value_range is not None:
            try:
                ranges[name] = value_range(name, *opt.value_range, inputs, "the model's value_range")
            except ValueRangeError as e:
                raise ValueRangeError(f"inputs.{name}.value_range: {e}") from None
    return ranges
