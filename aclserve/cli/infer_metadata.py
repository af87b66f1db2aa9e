"""What `aclserve infer` checks against the model's metadata before it sends anything: the input
names, the casts to the datatypes the model declares, the outputs asked for and which of them
may be classified. A mistake the metadata shows is the command line's (UsageError, exit 2) in
the server's words (input_refusals.py), not the server's 400 (exit 1, a server's error)."""
from __future__ import annotations

import numpy as np

from ..dtypes import cast_keeping_values, kserve_to_numpy
from ..input_refusals import CLASSIFIABLE, classification_refused, unknown_input, unknown_output
from ..quoting import quoted_name
from .usage import UsageError


def described(metadata, key: str) -> list[dict]:
    """The tensors metadata lists under `key` ("inputs", "outputs"), whatever shape it has."""
    listed = metadata.get(key) if isinstance(metadata, dict) else None
    return [t for t in listed if isinstance(t, dict)] if isinstance(listed, list) else []


def cast_to_model(inputs: dict[str, np.ndarray], metadata: dict) -> list[str]:
    """Cast each input to the dtype the model declares where dtypes.castable allows (float64 ->
    FP32, int64 -> INT32 or UINT8, integers -> a float, 0 and 1 -> BOOL); returns one note per cast
    (none for a byte order alone: `>f4` is FP32 already). UsageError, as the Python API refuses it
    (dtypes.cast_keeping_values), for a cast that would change a value: floats for an integer or
    BOOL input (they went to the server, whose 400 was exit 1, a server's error), an integer past
    the target's range; an image for another input, and a .npy for an image input, too."""
    notes = []
    declared = {t.get("name"): t.get("datatype") for t in described(metadata, "inputs")}
    for name, arr in inputs.items():
        if arr.dtype == object and declared.get(name, "BYTES") != "BYTES":  # (the server would say it too)
            raise UsageError(f"input {name} takes {declared[name]} tensors: an image (JPEG, PNG) goes to an "
                             "image input (BYTES); give a .npy file here")
        if arr.dtype != object and declared.get(name) == "BYTES":  # (the server's 400 was exit 1)
            raise UsageError(f"input {name} takes BYTES (encoded images): give a JPEG or PNG file here; "
                             "a .npy file goes to a numeric input")
        try:
            target = kserve_to_numpy(declared[name])
        except (KeyError, ValueError, TypeError):
            continue
        if arr.dtype != target:
            try:  # (a value it would wrap or make inf is refused: the server would run another input)
                inputs[name] = cast_keeping_values(arr, target)
            except ValueError as e:
                raise UsageError(f"input {name} {e}") from None
            if arr.dtype.newbyteorder("=") != target:
                notes.append(f"input {name}: {arr.dtype} cast to {declared[name]} as the model declares")
    return notes


def refuse_unknown_inputs(inputs: dict[str, np.ndarray], names: list) -> None:
    """UsageError (exit 2, bad input) for an input the model's metadata does not list, in the
    server's words; it was the server's 400 (exit 1, a server's error). No metadata: not judged."""
    if not names:
        return
    for name in inputs:
        if name not in names:
            raise UsageError(unknown_input(name, map(str, names)))


def requested_outputs(model: str, named: list[str], classification: int | None,
                      metadata) -> tuple[list[str], dict[str, int], list[str]]:
    """(the outputs to name in the request, {output: the top N classes to ask of it}, one note per
    output left unclassified). `named`: --output's, each checked against the metadata's outputs
    (unknown, or named twice: UsageError); none names every output when classifying (the request
    names each output it classifies), and then an output whose datatype cannot be classified (FP16,
    BOOL) is asked for as it is, with a note: asked for, the server refused the whole request. One
    that `named` gives is refused here, as the server would. No metadata of an output: not judged.
    Classifying, none named and none the metadata lists that can be classified: UsageError naming
    `model` (the request went on asking for no classes, and its outputs were printed as they are)."""
    datatypes = {t["name"]: t.get("datatype") for t in described(metadata, "outputs") if isinstance(t.get("name"), str)}
    seen = set()
    for name in named:
        if datatypes and name not in datatypes:
            raise UsageError(unknown_output(name, datatypes))
        if name in seen:
            raise UsageError(f"--output names {name!r} twice")
        seen.add(name)
    if not classification:
        return named, {}, []
    outputs = named or list(datatypes)
    if not outputs:  # (an aclserve model has outputs: a foreign server's metadata may list none)
        raise UsageError(f"model {quoted_name(model)}: none of its outputs can be classified: its metadata lists "
                         f"none (name them with --output)")
    classes, notes = {}, []
    for name in outputs:
        datatype = datatypes.get(name)
        if not isinstance(datatype, str) or datatype in CLASSIFIABLE:
            classes[name] = classification
        elif named:
            raise UsageError(classification_refused(name, datatype))
        else:
            notes.append(f"output {name}: {datatype}, printed as it is (classification is only for integer, "
                         f"FP32 and FP64 outputs, as in Triton)")
    if not classes:  # (sent, its answer was the outputs as they are: no classification asked of any)
        kinds = ", ".join(sorted({datatypes[name] for name in outputs}))
        raise UsageError(f"model {quoted_name(model)}: none of its outputs can be classified: they are {kinds} "
                         f"(classification is only for integer, FP32 and FP64 outputs, as in Triton)")
    return outputs, classes, notes
