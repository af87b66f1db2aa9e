"""The values each integer input of a version takes, for the server to refuse the others (400).

Two sources: the compile of a dropped .onnx finds the inputs that index a table of the model
(om/index_bounds.py, kept in the compile cache's manifest), and an input's `value_range` in the
model's YAML sets or replaces a range (an .om served as it is has only that, whoever compiled
it: an OM carries none). An image input takes pictures, decoded by the server: no range.
Checked when the version loads: a model's own range for an input the model does not have, for a
non-integer one, or with a bound past what the input's type holds fails the load, naming it
(ConfigError).
model_defaults' range is meant for every model and fails none: it is clipped to what the input's
type holds, narrowed to the table the input indexes (never widening it: ids past the table
failed on the device, an instance rebuilt for each such request), and passed over where it
cannot apply (no such integer input, no index of the table inside it), each said in an INFO line
(the model's metadata gives the range in force).
The range and the check itself: ../value_ranges.py.
"""
from __future__ import annotations

import logging
from typing import Collection, Mapping, Sequence

import numpy as np

from ..config import ConfigError, TensorOptions
from ..runtime.types import TensorSpec
from ..value_ranges import ValueRange, ValueRangeError, table_range, value_range

log = logging.getLogger(__name__)
DEFAULTS_WHY = "model_defaults' value_range"  # what a refusal says of a range model_defaults gives
TABLE_WHY = "it indexes a table of the model"  # ... of the range the compile found


def input_ranges(options: Mapping[str, TensorOptions], inputs: Sequence[TensorSpec],
                 index_bounds: Mapping[str, int], label: str = "",
                 images: Collection[str] = ()) -> dict[str, ValueRange]:
    """{input name: range} from the compile's table sizes, then the config's ranges over them
    (model_defaults' fitted to the model `label` names in what it says). `images`: the inputs
    that take pictures, decoded here (the ImageStage's: model_defaults' image settings passed
    over leave an input its tensor)."""
    specs = {s.name: s for s in inputs}
    # (capped to what the input's type holds: a UINT8 input indexing a table of 1,000 takes 0..255)
    ranges = {name: ValueRange(*table_range(entries, specs[name].dtype), TABLE_WHY)
              for name, entries in index_bounds.items()
              if name in specs and specs[name].dtype.kind in "iu" and name not in images}
    for name, opt in options.items():
        if opt.value_range is None:
            continue
        if "value_range" in opt.from_defaults:
            fitted = _fitted_default(name, opt.value_range, inputs, label)
            if fitted is not None:
                ranges[name] = fitted if name not in ranges else _within_table(name, fitted, ranges[name], label)
            continue
        try:
            own = value_range(name, *opt.value_range, inputs, "the model's value_range")
        except ValueRangeError as e:
            raise ConfigError(f"inputs.{name}.value_range", str(e)) from None
        table = ranges.get(name)
        if table is not None and (own.low < table.low or own.high > table.high):  # (it replaces it, as said)
            log.warning("%s: inputs.%s.value_range %s goes past %d..%d, the indices of the table the input "
                        "indexes: a value outside them fails on the device (its instance rebuilt)", label, name,
                        list(opt.value_range), table.low, table.high)
        ranges[name] = own
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


def _within_table(name: str, default: ValueRange, table: ValueRange, label: str) -> ValueRange:
    """model_defaults' range (fitted to the input's type) inside the table's range the compile
    found: the default may narrow it, never widen it (an id past the table reaches the device and
    fails there). Where they share no value the table's range stands, the default passed over
    (meant for every model, it fails none). Said in an INFO line unless the default fits inside."""
    low, high = max(default.low, table.low), min(default.high, table.high)
    given = [default.low, default.high]
    indices = f"{table.low}..{table.high}, the indices of the table the input indexes"
    if low > high:
        log.info("%s: model_defaults' inputs.%s.value_range passed over: %s shares no value with %s", label, name,
                 given, indices)
        return table
    if (low, high) == (default.low, default.high):
        return default
    if (low, high) == (table.low, table.high):
        log.info("%s: model_defaults' inputs.%s.value_range %s narrowed to %s", label, name, given, indices)
        return table
    log.info("%s: model_defaults' inputs.%s.value_range %s narrowed to %d..%d, within %s", label, name, given,
             low, high, indices)
    return ValueRange(low, high, f"{DEFAULTS_WHY} within the table the input indexes")
