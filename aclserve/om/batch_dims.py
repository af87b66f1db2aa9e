"""Which dimension of a model's inputs is the batch, where the model leaves it to be guessed:
a batch past dimension 0 (a sequence-first export, an RNN's [T, N, F]) is refused saying so, and
inputs whose dimension 0 has different symbols ([N, 4] and [M, 4]) are said to be taken for one
batch. Both were found by a tester (t85): the first was refused as "dim 1 is dynamic (batch)", the
second served as one batch without a word. Pure functions over (input name, dims) pairs, dims as
spec.dims_of gives them (ints for fixed dims, the symbol or None for dynamic ones).
"""
from __future__ import annotations

from .compile_error import CompileError

# symbols an exporter (or a user) gives a batch dimension: "batch", "batch_size", "N"
_BATCH_LETTERS = {"n", "b", "bs"}
EXAMPLE_SIZE = 16  # what an example --input-shape gives an open dimension that is not the batch


def names_a_batch(symbol) -> bool:
    return isinstance(symbol, str) and ("batch" in symbol.lower() or symbol.lower() in _BATCH_LETTERS)


def refuse_batch_past_first(inputs: list[tuple[str, list]]) -> None:
    """CompileError for an input whose dimension past 0 is open and named as a batch, its
    dimension 0 not: aclserve batches along dimension 0 only (as ATC's --dynamic_batch_size), so
    the way out is the model's own (batch-first) or a compile without batch sizes, which the
    message gives as --input-shape."""
    for name, dims in inputs:
        if not dims or names_a_batch(dims[0]):  # (["batch", "n", 3]: "n" a count of points, not the batch)
            continue
        # a letter (N, b) past an open dimension 0 is as likely a count ([?, N, 3]: N points) as a batch
        axis = next((axis for axis, d in enumerate(dims[1:], start=1)
                     if names_a_batch(d) and (isinstance(dims[0], int) or "batch" in d.lower())), None)
        if axis is None:
            continue
        shown = "[" + ",".join(str(d) if isinstance(d, int) else "?" for d in dims) + "]"
        raise CompileError(
            f"input {name!r} has its batch at dimension {axis} ({dims[axis]}; shape {shown}), as a sequence-first "
            "model ([T, N, F]: an RNN exported without batch_first) has: aclserve batches requests along "
            "dimension 0 only, as ATC's --dynamic_batch_size does; export the model batch-first (its batch at "
            "dimension 0), or compile it without batch sizes, every dimension fixed: --input-shape "
            f"\"{_fixed_example(inputs)}\" (a request then gives that shape)")


def _fixed_example(inputs: list[tuple[str, list]]) -> str:
    """Every input's dims fixed: a batch symbol at 1, another open dimension at EXAMPLE_SIZE."""
    def size(d) -> str:
        return str(d) if isinstance(d, int) else "1" if names_a_batch(d) else str(EXAMPLE_SIZE)
    return ";".join(f"{name}:{','.join(size(d) for d in dims)}" for name, dims in inputs if dims)


def distinct_batch_symbols(inputs: list[tuple[str, list]]) -> str | None:
    """The warning for a dynamic-batch model whose inputs name dimension 0 with different symbols
    (an exporter naming each input's own, PyTorch's list-form dynamic_axes or tf2onnx's unk__N,
    or sizes truly apart): all are taken for the one batch, as ATC takes every -1 first dimension,
    so each request gives them the same rows (a request that does not is refused, 400). A warning,
    not a refusal: the exporters' names are the common case. None when they share one symbol."""
    named = [(name, dims[0]) for name, dims in inputs if dims and isinstance(dims[0], str)]
    if len({symbol for _, symbol in named}) < 2:
        return None
    listed = [f"{name!r} ({symbol})" for name, symbol in named]
    every = "both" if len(named) == 2 else "all"
    return (f"inputs {', '.join(listed[:-1])} and {listed[-1]} name their dimension 0 with different symbols: "
            f"{every} are taken for the one batch dimension, as ATC takes every -1 first dimension under "
            "--dynamic_batch_size, so a request must give them the same number of rows; where they are not one "
            "batch, fix their sizes with --input-shape")
