"""What an infer request's answer may hold in memory, charged to its lease (budget.py) once the
request is decoded and before it is queued, so the budget sees a model's large outputs as it
sees large inputs: the outputs' arrays (the request's rows of the model's output shapes) and
their encoding (JSON text, or the binary body's copies). A 413 names the answer and how to need
less (answer_hint: binary outputs where some are JSON, else fewer rows). Dimensions the model leaves open count as 1 (an
estimate, like the rest of the budget; Signature.output_rows).
"""
from __future__ import annotations

from .codec import InferRequest, Signature

# The longest number orjson writes (a float64's shortest repr, 24 characters) and its comma.
JSON_BYTES_PER_VALUE = 25
# One classification entry: its "value:index:label" text and the str objects made for it.
CLASS_ENTRY_BYTES = 128


def answer_bytes(sig: Signature, req: InferRequest, binary_copies: int, json_outputs: bool) -> int:
    """Bytes the answer to `req` may hold at its peak. `binary_copies`: copies of a binary
    output the transport makes on top of the array (the joined HTTP body; gRPC's bytes and
    message); `json_outputs`: the transport writes JSON outputs where the request asks for them
    (HTTP), else every output is binary (gRPC)."""
    if req.outputs is None:  # every output, all alike (the common case: worked out per Signature)
        row_bytes, row_values, fixed_bytes, fixed_values = sig.all_outputs
        array = req.rows * row_bytes + fixed_bytes
        if req.binary_output or not json_outputs:
            return array * (1 + binary_copies)
        return array + (req.rows * row_values + fixed_values) * JSON_BYTES_PER_VALUE
    rows_of = sig.output_rows
    wanted = [(rows_of[o.name], req.binary_output if o.binary is None else o.binary, o.classification)
              for o in req.outputs]
    total = 0
    for (batched, per_row, itemsize), binary, classes in wanted:
        values = (req.rows if batched else 1) * per_row
        array = values * itemsize
        if classes:
            total += array + values // per_row * min(classes, per_row) * CLASS_ENTRY_BYTES
        elif binary or not json_outputs:
            total += array * (1 + binary_copies)
        else:
            total += array + values * JSON_BYTES_PER_VALUE
    return total


def answer_hint(sig: Signature, req: InferRequest, json_outputs: bool) -> str:
    """How the answer to `req` could need less, for its 413: binary outputs where some would be
    JSON, else fewer rows (or fewer outputs, when it asks for all of several)."""
    if json_outputs and _some_json(req):
        return "ask for binary outputs (binary_data_output) or send fewer rows per request"
    fewer_outputs = ", or ask only for the outputs needed" if req.outputs is None and len(sig.outputs) > 1 else ""
    return f"send fewer rows per request{fewer_outputs}"


def _some_json(req: InferRequest) -> bool:
    """Whether an output of the answer is written as JSON (a classification is text either way)."""
    if req.outputs is None:
        return not req.binary_output
    return any(not o.classification and not (req.binary_output if o.binary is None else o.binary)
               for o in req.outputs)
