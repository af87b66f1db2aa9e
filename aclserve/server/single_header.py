"""Headers a request may send at most once (Inference-Header-Content-Length, Authorization as an
HTTP header or gRPC metadata): a repeat is refused 400 / INVALID_ARGUMENT in one wording,
whichever header it is. No value is quoted: one may be the API token."""
from __future__ import annotations

from typing import Sequence

from ..errors import InvalidInput


def single_value(name: str, values: Sequence[str]) -> str | None:
    """The one value of header `name` among `values` (every occurrence the request sent), None
    when it sent none; InvalidInput when it sent more than one."""
    if len(values) > 1:
        raise InvalidInput(f"{name} is given {len(values)} times; send it once")
    return values[0] if values else None
