"""An integer input's values against the range the model takes (repository/value_ranges.py).

A value outside it is the client's mistake, answered 400 naming the input, the value and the
range, before the request is queued: on the device such a value is an index past a table,
which fails the batch (a device fault: 500, the instance rebuilt, the other requests of the
batch run again) or, on CANN's AI Core kernels, reads zeros (a wrong answer).
"""
from __future__ import annotations

from typing import Mapping

from ..errors import InvalidInput


def check_values(arrays: Mapping, ranges: Mapping) -> None:
    """Raise InvalidInput for the first input holding a value outside its range."""
    for name, allowed in ranges.items():
        array = arrays.get(name)
        if array is None or not array.size:
            continue
        low, high = int(array.min()), int(array.max())
        if low < allowed.low or high > allowed.high:
            bad = low if low < allowed.low else high
            raise InvalidInput(f"input '{name}': value {bad} is outside {allowed.low}..{allowed.high}, the values "
                               f"the model takes ({allowed.why})")
