"""The parameters of a request, an input or an output: the values the protocol lets them hold,
and the shared-memory keys this server refuses (HTTP's JSON and gRPC's maps alike), and a JSON
request's unsigned integers (priority, timeout)."""
from __future__ import annotations

import math
import re

from ..errors import InvalidInput
from ..quoting import quoted, quoted_integer

SHM_KEYS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
UINT64_MAX = 2**64 - 1  # priority and timeout are uint64 in KServe v2 / Triton


def json_unsigned(params: dict, key: str, text) -> int | None:
    """`params[key]` of a JSON request (whose JSON is `text`) as an unsigned 64-bit integer,
    None without it; a string of its digits is taken too. Any other value is refused, quoted as
    the client wrote it."""
    value = params.get(key)
    if value is None:
        return None
    # ASCII and at most uint64's 20 digits: int() refuses "²" (a digit to isdigit) and 4,300+ digits
    number = value
    if type(value) is str and len(value) <= 20 and value.isascii() and value.isdigit():
        number = int(value)
    if type(number) is not int or not 0 <= number <= UINT64_MAX:
        raise InvalidInput(f"parameters.{key} must be an unsigned 64-bit integer (at most {UINT64_MAX}), "
                           f"got {_as_sent(value, key, text)}")
    return number


def _as_sent(value, key: str, text) -> str:
    """The JSON decoders read an integer beyond 64 bits as a float (orjson's, and the stdlib's as
    this server runs it: json_overflow.py): 2**64 was quoted 1.8446744073709552e+19 (a tester).
    Such a float is quoted by the digits written after the key in `text` that it was read from;
    the float itself when none is found (an escape in the key, or a float the client wrote) or
    another number the same float could be is written after that key elsewhere (an output's)."""
    if type(value) is float and (math.isinf(value) or (value.is_integer() and abs(value) >= 2**63)):
        pattern = rb'"' + re.escape(key.encode()) + rb'"[ \t\r\n]*:[ \t\r\n]*(-?[0-9]+)(?![0-9.eE])'
        # (one candidate only: the key may be an output's or an input's parameter too, its digits another's)
        candidates = {digits for digits in re.findall(pattern, text) if float(digits) == value}
        if len(candidates) == 1:
            return quoted_integer(candidates.pop().decode())
    return quoted(value)


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
