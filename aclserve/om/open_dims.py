"""Input dimensions left open past the batch, refused all at once with an --input-shape that fixes
them: an OM runs fixed sizes but the batch's (ATC's --dynamic_batch_size). A refusal naming the
first such dimension only led a tester (t96: a transformer's input_ids and attention_mask, both
[batch, seq]) from one refusal to the next, each time to be told of another input. The example
gives each symbol one placeholder (seq: SEQ), so inputs sharing a size are given the same one, and
an unnamed dimension one of its own (SIZE). Pure functions over (input name, dims) pairs as
spec.resolve holds them: ints for fixed dims, the symbol or None for open ones.
"""
from __future__ import annotations

import re

from .batch_dims import joined
from .compile_error import OpenDims

UNNAMED = "SIZE"  # the placeholder of a dimension the model names no symbol for


def refuse_open_dims(inputs: list[tuple[str, list]], dynamic: bool, given: set[str]) -> None:
    """OpenDims (a CompileError) naming every open dimension of `inputs` but a dynamic batch's
    (dimension 0 when `dynamic`), with an --input-shape that fixes them all: the inputs with such a
    dimension and those --input-shape already gave (`given`), which the new value replaces."""
    found = [(name, axis, d) for name, dims in inputs for axis, d in enumerate(dims)
             if not isinstance(d, int) and not (dynamic and axis == 0)]
    if not found:
        return
    names = _placeholders(found)
    said = [f"input {name!r} dim {axis}" + (" is dynamic" if i == 0 else "") + f" ({d or '?'})"
            for i, (name, axis, d) in enumerate(found)]
    also = f", as {'is' if len(said) == 2 else 'are'} {joined(said[1:])}" if len(said) > 1 else ""
    shown = {name for name, _, _ in found} | given

    def size(name: str, axis: int, d) -> str:
        return str(d) if isinstance(d, int) else "-1" if dynamic and axis == 0 else names[(name, axis)]
    example = ";".join(f"{name}:{','.join(size(name, axis, d) for axis, d in enumerate(dims))}"
                       for name, dims in inputs if name in shown)
    which = sorted(set(names.values()), key=list(names.values()).index)
    legend = (f"{which[0]}: the size to serve, which every request then gives" if len(which) == 1 else
              f"{', '.join(which)}: the sizes to serve, which every request then gives")
    raise OpenDims(f"{said[0]}{also}; fix {'it' if len(said) == 1 else 'them'} with --input-shape (only the "
                   f"batch dimension may be dynamic), e.g. --input-shape \"{example}\" ({legend})", found,
                   {name: [d if isinstance(d, int) else -1 for d in dims] for name, dims in inputs})


def _placeholders(found: list[tuple[str, int, object]]) -> dict[tuple[str, int], str]:
    """{(input, axis): its placeholder}: one a symbol, upper case and of letters, digits and _ (seq:
    SEQ, s53: S53), each unnamed dimension one of its own; two symbols never share one."""
    by_symbol: dict[object, str] = {}
    placed = {}
    for name, axis, d in found:
        key = d if d else (name, axis)  # (unnamed: a dimension of its own)
        if key not in by_symbol:
            base = re.sub(r"[^A-Z0-9_]", "_", d.upper()) if d else UNNAMED
            base = base if base[:1].isalpha() else f"{UNNAMED}_{base}"
            taken = set(by_symbol.values())
            by_symbol[key] = base if base not in taken else next(
                f"{base}_{n}" for n in range(2, len(taken) + 3) if f"{base}_{n}" not in taken)
        placed[(name, axis)] = by_symbol[key]
    return placed
