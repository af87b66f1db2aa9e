"""A large infer answer's JSON written a slice of values at a time, the event loop given its turn
between slices.

orjson writes an array in one call, which holds the interpreter lock throughout (so a worker
thread would not free the loop either): one answer of 8,388,608 FP32 values, 92 MB of JSON, held
the event loop 0.4-1.3 s, no other request read or answered meanwhile, and a client asking for it
in a loop cut the others' answers tenfold. An answer whose JSON outputs hold more than
SLICE_VALUES values is written by dumps_sliced: each output's values as slices of at most
SLICE_VALUES (orjson writes a 1-D slice as `[a,b,...]`, each value on its own, so the slices
without their brackets, joined by commas, are the whole array's text byte for byte), the rest of
the document by orjson as json_tensors.dumps_response writes it, and `asyncio.sleep(0)` once
SLICE_VALUES values have been written since the last turn. Smaller answers are written in one
call, as before, and without a coroutine (encode.py): a small answer costs what it did.
"""
from __future__ import annotations

import asyncio

import numpy as np

from .json_tensors import dumps, non_finite_count

# About 3 ms of orjson for FP32 or FP64 values (45 ns a value on this VM, unloaded), 0.6 ms for
# INT8; a turn costs a round of the loop (tens of us) per slice.
SLICE_VALUES = 1 << 16


async def dumps_sliced(doc: dict) -> bytearray:
    """json_tensors.dumps_response(doc), byte for byte (non-finite values as null, counted in
    their output's `parameters.non_finite_values`), the event loop given its turn every
    SLICE_VALUES values. Written into a bytearray, returned as it is (one more copy of 92 MB, to
    bytes, held the loop 47 ms). `doc["outputs"]` holds binary outputs' entries and
    json_tensors.output_entry's. Cancellation (the client went away): raised at a turn."""
    turns = _Turns()
    text = bytearray(b"{")
    for i, (key, value) in enumerate(doc.items()):
        text += b"%s%s:" % (b"," if i else b"", dumps(key))
        if key != "outputs":
            text += dumps(value)
            continue
        text += b"["
        for j, entry in enumerate(value):
            if j:
                text += b","
            await _write_entry(entry, text, turns)
        text += b"]"
    text += b"}"
    return text


def _values(entry: dict) -> int:
    data = entry.get("data")  # binary outputs have none here
    return data.size if isinstance(data, np.ndarray) else 0


async def _write_entry(entry: dict, text: bytearray, turns: _Turns) -> None:
    """One output's object: its keys as orjson writes them, its data sliced, then (as
    dumps_response adds it) `parameters` counting its non-finite values when it has any
    (output_entry's entries have no `parameters` of their own)."""
    if not _values(entry):
        text += dumps(entry)
        return
    non_finite = 0
    for i, (key, value) in enumerate(entry.items()):
        text += b"%s%s:" % (b"," if i else b"{", dumps(key))
        if key == "data":
            non_finite = await _write_array(value, text, turns)
        else:
            text += dumps(value)
    if non_finite:
        entry["parameters"] = {"non_finite_values": non_finite}
        text += b',"parameters":' + dumps(entry["parameters"])
    text += b"}"


async def _write_array(data: np.ndarray, text: bytearray, turns: _Turns) -> int:
    """A 1-D array's JSON text, a slice at a time; returns how many of its values are not finite
    (written as null)."""
    text += b"["
    non_finite = 0
    for start in range(0, data.size, SLICE_VALUES):
        piece = data[start:start + SLICE_VALUES]
        written = dumps(piece)
        if start:
            text += b","
        text += memoryview(written)[1:-1]
        if data.dtype.kind == "f" and b"null" in written:
            non_finite += non_finite_count(piece)
        await turns.wrote(piece.size)
    text += b"]"
    return non_finite


class _Turns:
    """Values written since the event loop's last turn; one answer's, on the loop."""

    def __init__(self):
        self._since = 0

    async def wrote(self, values: int) -> None:
        self._since += values
        if self._since >= SLICE_VALUES:
            self._since = 0
            await asyncio.sleep(0)
