"""The parameters of a request, an input or an output: the values the protocol lets them hold,
and the shared-memory keys this server refuses (HTTP's JSON and gRPC's maps alike)."""
from __future__ import annotations

from ..errors import InvalidInput
from .quoting import quoted

SHM_KEYS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


def refuse_shared_memory(params, where: str) -> None:
    for key in SHM_KEYS:
        if key in params:
            raise InvalidInput(f"{where}: {key}: shared memory is not supported by this server")


def refuse_compound_values(params: dict, where: str = "") -> None:
    """A JSON parameter's value is a string, a number or a boolean (null stands for none), as
    Triton checks; an array or an object is refused, naming it."""
    for key, value in params.items():
        if type(value) in (list, dict):
            prefix = f"{where}: " if where else ""
            raise InvalidInput(f"{prefix}parameter {quoted(key)} must be a string, number or boolean, "
                               f"got {quoted(value)}")
