"""What a compile is asked for as text: `--input-shape` (compile.input_shape) and `--batch`
(compile.batch) parsed, --input-shape's names matched to the model's inputs, and `--precision-mode`
(compile.precision_mode) checked. Pure functions, without onnx: the config's reader checks the two
that need no model with them (OptionRefused).

A name is taken as written: it may hold spaces, tabs or any character but `;` (" x " and
"ü ñ\t" are inputs exporters write), and its dims follow its last `:`, as ATC's SplitInputShape
reads it (a TF-style "x:0:-1,4" names x:0). Blanks around the separators are taken too ("a:1,3;
b : 2"): a name that is no model input as written names the input it is without the blanks
around it (input_names). Dims may be empty, "x:", for a rank-0 input (ATC's own --input_shape
writes a declared scalar so).
"""
from __future__ import annotations

import re

from .compile_error import CompileError, OptionRefused
from .gears import MAX_BATCH_SIZE, MAX_BATCH_SIZE_WHY, MAX_GEARS
from .plain_numbers import plain_number

# ATC's --precision_mode values (its flag help, hicann/ge api/atc; the ATC page "--precision_mode"):
# any other is refused on both targets (atc_options.py)
PRECISION_MODES = ("force_fp16", "force_fp32", "cube_fp16in_fp32out", "allow_fp32_to_fp16", "must_keep_origin_dtype",
                   "allow_mix_precision", "allow_mix_precision_fp16", "allow_mix_precision_bf16", "allow_fp32_to_bf16")
MAX_DIM = 2**63 - 1  # ONNX (and ACL) dims are int64; a tensor's size in bytes must fit one too
# the name ends at the last colon; the dims (none for a scalar) may have blanks around their commas
_NAME_DIMS = re.compile(r"^(?P<name>.+):(?P<dims>\s*(?:-?[0-9]+(?:\s*,\s*-?[0-9]+)*)?\s*)$", re.DOTALL)


def parse_input_shape(text: str | None) -> dict[str, list[int]]:
    """"name:-1,3,224,224;name2:1,16;scalar:" -> {name: dims}, each name as written (input_names
    matches it to the model's). Raises OptionRefused on malformed text."""
    if text is None or not text.strip():
        return {}
    shapes: dict[str, list[int]] = {}
    for part in text.split(";"):
        if not part.strip():
            continue
        m = _NAME_DIMS.match(part)
        if m is None or not m["name"].strip():
            raise OptionRefused("--input-shape", lambda named: f"malformed {named}entry {part!r}: expected "
                                "name:d0,d1,... with integer dims (name: for a scalar)")
        name, dims = m["name"], [int(d) for d in m["dims"].split(",") if d.strip()]
        if any(d == 0 or d < -1 for d in dims):
            raise OptionRefused("--input-shape", lambda named: f"malformed {named}entry {part!r}: dims must be "
                                "positive or -1")
        if any(d > MAX_DIM for d in dims):
            raise OptionRefused("--input-shape", lambda named: f"{named}entry {part!r}: a dim is at most {MAX_DIM} "
                                "(int64)")
        if name in shapes:
            raise OptionRefused("--input-shape", lambda named: f"{named}names input {name!r} twice")
        shapes[name] = dims
    return shapes


def check_precision_mode(mode: str | None) -> str | None:
    """The precision mode as ATC writes it, a named choice taken in any case (README
    "Configuration"), or OptionRefused for one that is none of ATC's (None: ATC's default, force_fp16)."""
    if mode is None:
        return None
    if mode.lower() not in PRECISION_MODES:
        raise OptionRefused("--precision-mode", lambda named: f"{named}{mode!r} is not one ATC takes: "
                            f"{', '.join(PRECISION_MODES)}")
    return mode.lower()


def input_names(given, names: list[str]) -> dict[str, str]:
    """{name as given: the model's input it names} for --input-shape's names `given`: the input
    of that name, else the one it is without the blanks around it. Refuses a name of no input,
    and two naming one input; names are quoted as repr shows them, blanks and all (a listed " x "
    looked like the x asked for)."""
    matched: dict[str, str] = {}
    for name in given:
        own = name if name in names else name.strip() if name.strip() in names else None
        if own is None:
            raise CompileError(f"--input-shape names unknown input {name!r} (model inputs: "
                               f"{', '.join(map(repr, names))})")
        if own in matched.values():
            raise CompileError(f"--input-shape names input {own!r} twice")
        matched[name] = own
    return matched


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
    if gears[-1] > MAX_BATCH_SIZE:
        raise CompileError(f"--batch sizes are at most {MAX_BATCH_SIZE}, {MAX_BATCH_SIZE_WHY}, got {gears[-1]}")
    return gears
