"""An integer input's values against the range the model takes (repository/value_ranges.py),
checked before the request is queued: a value outside it is answered 400 naming the input, the
value and the range (the check, shared with the Python API's Engine: value_ranges.py).
"""
from __future__ import annotations

from typing import Mapping

from ..errors import InvalidInput
from ..value_ranges import out_of_range


def check_values(arrays: Mapping, ranges: Mapping) -> None:
    """Raise InvalidInput for the first input holding a value outside its range."""
    refusal = out_of_range(arrays, ranges)
    if refusal is not None:
        raise InvalidInput(refusal)
