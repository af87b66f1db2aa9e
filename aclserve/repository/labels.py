"""Class labels of a model's outputs (Triton's label_filename): one label per line, line i
naming class i. Read when a version loads; a missing file or an unreadable one (or a FIFO, socket
or device node, refused unopened) fails the load, naming the file. A YAML's `labels` must have one
line per class (a count that differs fails the load: most likely the wrong file). A config.pbtxt's
label_filename is read as Triton reads it (label_provider.cc): any number of lines, those past the
output's classes unused and the classes past the file's lines without a label (an ImageNet list
of 1001 lines, background first, on a 1000-class output is common), said in a WARNING line.
model_defaults' labels, meant for every model, fail none: a model without the output, or whose
output has another number of classes, is served without them, said in an INFO line (a file that
cannot be read fails the load all the same: it fits no model)."""
from __future__ import annotations

import logging
import math
import os
from typing import Mapping, Sequence

from ..config import ConfigError, TensorOptions
from ..regular_files import open_regular
from ..runtime.types import TensorSpec

log = logging.getLogger(__name__)

MAX_LABELS_BYTES = 4 * 1024 * 1024


class LabelsError(ValueError):
    """A labels file cannot serve its output; the message names the file and the problem."""


def load_labels(options: Mapping[str, TensorOptions], outputs: Sequence[TensorSpec],
                label: str = "") -> dict[str, tuple[str, ...]]:
    """{output name: labels} for every output with a labels file. Blocking (reads files). A labels
    setting the model cannot take: ConfigError naming its key (outputs.y.labels). `label`: the
    model version as its log lines name it ("m:1")."""
    specs = {s.name: s for s in outputs}
    out = {}
    for name, opt in options.items():
        if opt.labels is None:
            continue
        defaults = "labels" in opt.from_defaults
        spec = specs.get(name)
        if spec is None:
            missing = f"the model has no output {name!r} (outputs: {', '.join(specs)})"
            if defaults:
                log.info("%s: model_defaults' outputs.%s.labels passed over: %s", label, name, missing)
                continue
            raise ConfigError(f"outputs.{name}.labels", missing)
        classes = math.prod(spec.sample_shape)
        try:
            labels = read_labels(opt.labels, classes, name, strict=not (opt.labels_as_triton or defaults))
        except LabelsError as e:
            raise ConfigError(f"outputs.{name}.labels", str(e)) from None
        if len(labels) != classes and defaults:
            log.info("%s: model_defaults' outputs.%s.labels passed over: %s", label, name,
                     _count_differs(opt.labels, len(labels), name, classes))
            continue
        if len(labels) != classes:
            _say_the_count(label, opt.labels, name, len(labels), classes)
        out[name] = labels[:classes]
    return out


def read_labels(path: str, classes: int, output: str, strict: bool = True) -> tuple[str, ...]:
    """The file's labels, trailing blank lines left out. `strict`: a count other than `classes`
    fails (LabelsError); else any count is returned."""
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
    if strict and len(labels) != classes:
        raise LabelsError(_count_differs(path, len(labels), output, classes))
    return labels


def _count_differs(path: str, lines: int, output: str, classes: int) -> str:
    return f"labels file {os.path.basename(path)} has {lines} labels; output {output!r} has {classes} classes"


def _say_the_count(label: str, path: str, output: str, lines: int, classes: int) -> None:
    if lines > classes:
        what = f"line {lines} is not used" if lines == classes + 1 else f"lines {classes + 1}-{lines} are not used"
    else:
        what = (f"class {lines} has no label" if lines == classes - 1 else
                f"classes {lines}-{classes - 1} have no label") + ' (a classification says "value:index" there)'
    log.warning("%s: label_filename %s of output %r has %d lines and the output %d classes: %s, as Triton reads "
                "the file (line i names class i, counted from 0)", label, os.path.basename(path), output, lines,
                classes, what)
