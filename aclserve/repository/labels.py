"""Class labels of a model's outputs (Triton's label_filename): one label per line, line i
naming class i. Read when a version loads; a missing file, an unreadable one (or a FIFO, socket
or device node, refused unopened) or one whose line count differs from the output's class count
fails the load, naming the file."""
from __future__ import annotations

import math
import os
from typing import Mapping, Sequence

from ..config import TensorOptions
from ..regular_files import open_regular
from ..runtime.types import TensorSpec

MAX_LABELS_BYTES = 4 * 1024 * 1024


class LabelsError(ValueError):
    """A labels file cannot serve its output; the message names the file and the problem."""


def load_labels(options: Mapping[str, TensorOptions], outputs: Sequence[TensorSpec]) -> dict[str, tuple[str, ...]]:
    """{output name: labels} for every output with a labels file. Blocking (reads files)."""
    specs = {s.name: s for s in outputs}
    out = {}
    for name, opt in options.items():
        if opt.labels is None:
            continue
        spec = specs.get(name)
        if spec is None:
            raise LabelsError(f"outputs.{name}: the model has no output {name!r} (outputs: {', '.join(specs)})")
        out[name] = read_labels(opt.labels, math.prod(spec.sample_shape), name)
    return out


def read_labels(path: str, classes: int, output: str) -> tuple[str, ...]:
    shown = os.path.basename(path)
    try:
        # utf-8-sig: a byte order mark (Notepad writes one) is not part of the first label
        with open_regular(path, "r", "utf-8-sig") as f:  # a FIFO put in its place must not hold the load
            if os.fstat(f.fileno()).st_size > MAX_LABELS_BYTES:
                raise LabelsError(f"labels file {shown} of output {output!r} is over {MAX_LABELS_BYTES} bytes")
            text = f.read()
    except OSError as e:
        raise LabelsError(f"labels file {shown} of output {output!r}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise LabelsError(f"labels file {shown} of output {output!r} is not UTF-8 text") from None
    labels = tuple(line.strip() for line in text.splitlines())
    while labels and not labels[-1]:
        labels = labels[:-1]
    if len(labels) != classes:
        raise LabelsError(f"labels file {shown} has {len(labels)} labels; output {output!r} has {classes} classes")
    return labels
