"""Which dimension of a model's inputs is the batch, where the model leaves it to be guessed:
a batch past dimension 0 (a sequence-first export, an RNN's [T, N, F]) is refused saying so, and
inputs whose dimension 0 has different symbols ([N, 4] and [M, 4]) are said to be taken for one
batch. Both were found by a tester (t85): the first was refused as "dim 1 is dynamic (batch)", the
second served as one batch without a word. An RNN's initial state, [layers, N, H] in ONNX's layout
whatever PyTorch's batch_first says, is told apart (a tester, t96: told to export batch-first, which
changes nothing), by the graph, not by its symbols' names: a torch.export (dynamo) export names
dimensions s0, s1, ..., so a state [1, s0, H] beside x [s0, s1, F] was told to fix s0 as an open
dimension (to serve what then takes no batch). The symbol at a state's batch is the batch in every
input: x [s1, s0, F] beside it is sequence-first. Pure functions over (input name, dims) pairs,
dims as spec.dims_of gives them (ints for fixed dims, the symbol or None for dynamic ones), and
over the graph for the states.
"""
from __future__ import annotations

import onnx

from .compile_error import CompileError

# symbols an exporter (or a user) gives a batch dimension: "batch", "batch_size", "N"
_BATCH_LETTERS = {"n", "b", "bs"}
EXAMPLE_SIZE = 16  # what an example --input-shape gives an open dimension that is not the batch
# an RNN node's inputs that are initial states, [num_directions, N, H], by index (ONNX's LSTM, GRU, RNN)
_STATE_INPUTS = {"LSTM": {5: "initial_h", 6: "initial_c"}, "GRU": {5: "initial_h"}, "RNN": {5: "initial_h"}}
_SAME_LAYOUT = {"Identity", "Cast"}  # nodes a state may pass through on its way, its layout kept


def names_a_batch(symbol) -> bool:
    return isinstance(symbol, str) and ("batch" in symbol.lower() or symbol.lower() in _BATCH_LETTERS)


def refuse_batch_past_first(inputs: list[tuple[str, list]],
                            states: dict[str, tuple[str, str]] | None = None) -> None:
    """CompileError for an input whose dimension past 0 is open and named as a batch, its
    dimension 0 not: aclserve batches along dimension 0 only (as ATC's --dynamic_batch_size), so
    the way out is the model's own (batch-first) or a compile without batch sizes, which the
    message gives as --input-shape. `states` (rnn_states): the inputs that are an RNN's initial
    state, whose batch is at dimension 1 whatever the export: their own way out is said."""
    states = states or {}
    symbols = _state_batches(inputs, states)
    past = [(name, dims, axis) for name, dims in inputs
            if (axis := _batch_axis(dims, name in states, symbols)) is not None]
    if not past:
        return
    sequences = [found for found in past if found[0] not in states]
    name, dims, axis = (sequences or past)[0]
    shown = "[" + ",".join(str(d) if isinstance(d, int) else "?" for d in dims) + "]"
    example = _fixed_example(inputs, {(found[0], found[2]) for found in past}, symbols)
    fixed = (f"compile it without batch sizes, every dimension fixed: --input-shape \"{example}\" "
             "(a request then gives that shape)")
    held = [found[0] for found in past if found[0] in states]
    if sequences:
        also = f"; {_states_told(held, states)}, {_STATE_LAYOUT}: {_STATE_WAY}" if held else ""
        raise CompileError(
            f"input {name!r} has its batch at dimension {axis} ({dims[axis] or '?'}; shape {shown}), as a "
            "sequence-first model ([T, N, F]: an RNN exported without batch_first) has: aclserve batches requests "
            "along dimension 0 only, as ATC's --dynamic_batch_size does; export the model batch-first (its batch at "
            f"dimension 0{also}), or {fixed}")
    raise CompileError(
        f"input {name!r} has its batch at dimension {axis} ({dims[axis] or '?'}; shape {shown}): "
        f"{_states_told(held, states)}, {_STATE_LAYOUT}, so an export batch-first changes nothing; aclserve batches "
        f"requests along dimension 0 only, as ATC's --dynamic_batch_size does: {_STATE_WAY}; or {fixed}")


_STATE_LAYOUT = "whose batch is at dimension 1 in ONNX's layout ([layers, N, H]) whatever batch_first says"
# (the final states an RNN gives back are [layers, N, H] too: an output not batch-major, refused next)
_STATE_WAY = ("wrap the model so that it takes the state batch-first ([N, layers, H]) and transposes it inside "
              "(h0.transpose(0, 1) before the RNN), and gives back any final state so too; or leave the state out "
              "of its inputs where it starts at zero (the RNN's default)")


def _state_batches(inputs: list[tuple[str, list]], states: dict[str, tuple[str, str]]) -> set[str]:
    """The symbols at an RNN's initial state's batch dimension (1: [layers, N, H]), whatever their names."""
    return {dims[1] for name, dims in inputs if name in states and _state_batch_open(dims) and dims[1]}


def _state_batch_open(dims: list) -> bool:
    """Whether a state's [layers, N, H] leaves its batch, N, open (its layers fixed, as exports give them)."""
    return len(dims) > 1 and isinstance(dims[0], int) and not isinstance(dims[1], int)


def _batch_axis(dims: list, state: bool = False, symbols: set[str] = frozenset()) -> int | None:
    """The dimension past 0 that is the batch where dimension 0 is not, else None: an RNN's initial
    state's (`state`) open dimension 1, one of a state's `symbols`, or one named as the batch."""
    if not dims or names_a_batch(dims[0]) or dims[0] in symbols:  # (["batch", "n", 3]: "n" a count of points)
        return None
    if state and _state_batch_open(dims):
        return 1
    # a letter (N, b) past an open dimension 0 is as likely a count ([?, N, 3]: N points) as a batch
    return next((axis for axis, d in enumerate(dims[1:], start=1) if d in symbols or
                 names_a_batch(d) and (isinstance(dims[0], int) or "batch" in d.lower())), None)


def _states_told(names: list[str], states: dict[str, tuple[str, str]]) -> str:
    """"'h0' (initial_h) and 'c0' (initial_c) are the initial state of LSTM node 'rnn'"."""
    nodes = {states[name][1] for name in names}
    if len(nodes) == 1:
        listed = [f"{name!r} ({states[name][0]})" for name in names]
        return f"{joined(listed)} {'is' if len(names) == 1 else 'are'} the initial state of {nodes.pop()}"
    return f"{joined([f'{name!r} ({states[name][0]} of {states[name][1]})' for name in names])} are initial states"


def joined(listed: list[str]) -> str:
    """"a, b and c"."""
    return ", ".join(listed[:-1]) + (" and " if len(listed) > 1 else "") + listed[-1]


def rnn_states(graph: onnx.GraphProto) -> dict[str, tuple[str, str]]:
    """{graph input: ("initial_h", "LSTM node 'name'")} for the inputs that reach an LSTM's, GRU's or
    RNN's initial state (directly or through an Identity or a Cast: nodes that keep its layout), in
    ONNX's default layout, [layers, N, H] (a node of layout 1 takes its state batch-first)."""
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, index))
    found = {}
    for vi in graph.input:
        reached, seen = [vi.name], {vi.name}
        while reached and vi.name not in found:
            for node, index in consumers.get(reached.pop(), []):
                role = _STATE_INPUTS.get(node.op_type, {}).get(index) if node.domain in ("", "ai.onnx") and \
                    not _batch_first(node) else None
                if role is not None:
                    named = f" {node.name!r}" if node.name else ""
                    found[vi.name] = (role, f"{node.op_type} node{named}")
                    break
                if node.op_type in _SAME_LAYOUT and node.output[0] not in seen:
                    seen.add(node.output[0])
                    reached.append(node.output[0])
    return found


def _batch_first(node: onnx.NodeProto) -> bool:
    """Whether an RNN node takes its tensors batch-first (its `layout` 1: states [N, layers, H])."""
    return any(a.name == "layout" and a.i == 1 for a in node.attribute)


def _fixed_example(inputs: list[tuple[str, list]], batches: set[tuple[str, int]], symbols: set[str]) -> str:
    """Every input's dims fixed: the batch at 1 (a symbol naming it or a state's `symbols`, and
    each (input, axis) of `batches`), another open dimension at EXAMPLE_SIZE."""
    def size(name: str, axis: int, d) -> str:
        if isinstance(d, int):
            return str(d)
        return "1" if names_a_batch(d) or d in symbols or (name, axis) in batches else str(EXAMPLE_SIZE)
    return ";".join(f"{name}:{','.join(size(name, axis, d) for axis, d in enumerate(dims))}"
                    for name, dims in inputs if dims)


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
