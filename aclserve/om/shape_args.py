"""What a compile is asked for as text: `--input-shape` (compile.input_shape) and `--batch`
(compile.batch) parsed. Pure functions.
"""
from __future__ import annotations

import re

from .compile_error import CompileError
from .gears import MAX_GEARS
from .plain_numbers import plain_number

MAX_DIM = 2**63 - 1  # ONNX (and ACL) dims are int64; a tensor's size in bytes must fit one too
# (spaces are taken around the separators only: a name may hold them, "input ids:-1,16"; the
# name ends at the last colon, as ATC's SplitInputShape reads it: TF-style names like "x:0")
_NAME_DIMS = re.compile(r"^(?P<name>.+?)\s*:\s*(?P<dims>-?[0-9]+(?:\s*,\s*-?[0-9]+)*)$")


def parse_input_shape(text: str | None) -> dict[str, list[int]]:
    """"name:-1,3,224,224;name2:1,16" -> {name: dims}. Raises CompileError on malformed text."""
    if text is None or not text.strip():
        return {}
    shapes: dict[str, list[int]] = {}
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        m = _NAME_DIMS.match(part)
        if m is None:
            raise CompileError(f"malformed --input-shape entry {part!r}: expected name:d0,d1,... with integer dims")
        name, dims = m["name"], [int(d) for d in m["dims"].split(",")]
        if any(d == 0 or d < -1 for d in dims):
            raise CompileError(f"malformed --input-shape entry {part!r}: dims must be positive or -1")
        if any(d > MAX_DIM for d in dims):
            raise CompileError(f"--input-shape entry {part!r}: a dim is at most {MAX_DIM} (int64)")
        if name in shapes:
            raise CompileError(f"--input-shape names input {name!r} twice")
        shapes[name] = dims
    return shapes


def parse_gears(text) -> list[int] | None:
    """"1,2,4,8" (or a list of ints) -> [1, 2, 4, 8]; None when not given."""
    if text is None:
        return None
    if isinstance(text, str):
        try:
            gears = [plain_number(s.strip(), integer=True) for s in text.split(",")]
        except ValueError:
            raise CompileError(f"malformed --batch {text!r}: expected comma-separated integers") from None
    else:
        gears = [int(g) for g in text]
    if not gears:
        raise CompileError("--batch needs at least one batch size")
    if any(g <= 0 for g in gears):
        raise CompileError(f"--batch sizes must be positive, got {','.join(map(str, gears))}")
    if len(set(gears)) != len(gears):
        raise CompileError(f"--batch sizes must be unique, got {','.join(map(str, gears))}")
    if gears != sorted(gears):
        raise CompileError(f"--batch sizes must be strictly ascending, got {','.join(map(str, gears))}")
    if len(gears) > MAX_GEARS:
        raise CompileError(f"--batch has {len(gears)} sizes; at most {MAX_GEARS} are allowed")
    if gears[-1] > MAX_DIM:
        raise CompileError(f"--batch sizes are at most {MAX_DIM} (int64), got {gears[-1]}")
    return gears
