"""The values each integer input of a version takes, for the server to refuse the others (400).

Two sources: the compile of a dropped .onnx finds the inputs that index a table of the model
(om/index_bounds.py, kept in the compile cache's manifest), and an input's `value_range` in the
model's YAML (or the server config's model_defaults) sets or overrides a range (an .om compiled
elsewhere has only that). An image input takes pictures, decoded by the server: no range.
Checked when the version loads: a model's own range for an input the model does not have, for a
non-integer one, or with a bound past what the input's type holds fails the load, naming it.
model_defaults' range is meant for every model and fails none: it is clipped to what the input's
type holds, and passed over where it cannot apply at all, each said in an INFO line (the model's
metadata gives the range in force). The range and the check itself: ../value_ranges.py.
"""
from __future__ import annotations

import logging
from typing import Mapping, Sequence

import numpy as np

from ..config import TensorOptions
from ..runtime.types import TensorSpec
from ..value_ranges import ValueRange, ValueRangeError, value_range

log = logging.getLogger(__name__)
DEFAULTS_WHY = "model_defaults' value_range"  # what a refusal says of a range model_defaults gives


def input_ranges(options: Mapping[str, TensorOptions], inputs: Sequence[TensorSpec],
                 index_bounds: Mapping[str, int], label: str = "") -> dict[str, ValueRange]:
    """{input name: range} from the compile's table sizes, then the config's ranges over them
    (model_defaults' fitted to the model `label` names in what it says)."""
    specs = {s.name: s for s in inputs}
    images = {name for name, opt in options.items() if opt.image is not None}  # pictures in, decoded here
    # (capped to what the input's type holds: a UINT8 input indexing a table of 1,000 takes 0..255)
    ranges = {name: ValueRange(0, min(entries - 1, int(np.iinfo(specs[name].dtype).max)),
                               "it indexes a table of the model")
              for name, entries in index_bounds.items()
              if name in specs and specs[name].dtype.kind in "iu" and name not in images}
    for name, opt in options.items():
        if opt.value_range is None:
            continue
        if opt.range_from_defaults:
            fitted = _fitted_default(name, opt.value_range, inputs, label)
            if fitted is not None:
                ranges[name] = fitted
            continue
        try:
            ranges[name] = value_range(name, *opt.value_range, inputs, "the model's value_range")
        except ValueRangeError as e:
            raise ValueRangeError(f"inputs.{name}.value_range: {e}") from None
    return ranges


def _fitted_default(name: str, bounds: tuple[int, int], inputs: Sequence[TensorSpec], label: str) -> ValueRange | None:
    """model_defaults' range for the input `name`, as the model can take it: clipped to what the
    input's type holds (a default of [0, 1000] gives a UINT8 input 0..255), or None where it
    cannot apply (no such input, not an integer one, no value of the type inside it); said in an
    INFO line. (A model's own range past its type fails its load: that is the model's mistake.)"""
    low, high = bounds
    spec = next((s for s in inputs if s.name == name), None)
    if spec is not None and spec.dtype.kind in "iu":
        held = np.iinfo(spec.dtype)
        low, high = max(low, int(held.min)), min(high, int(held.max))
    try:
        fitted = value_range(name, low, high, inputs, DEFAULTS_WHY) if low <= high else None
    except ValueRangeError as e:  # no such input, or not an integer one
        fitted, why = None, str(e)
    else:
        why = f"{list(bounds)} holds no value of {spec.datatype} ({held.min}..{held.max})" if fitted is None else ""
    if fitted is None:
        log.info("%s: model_defaults' inputs.%s.value_range passed over: %s", label, name, why)
    elif (low, high) != tuple(bounds):
        log.info("%s: model_defaults' inputs.%s.value_range %s clipped to %d..%d, what %s holds", label, name,
                 list(bounds), low, high, spec.datatype)
    return fitted
