"""Option types of the benchmark tools of tools/ (argparse `type=`): a value a run cannot use is
refused before anything starts, in argparse's usage line naming the option, exit status 2 (an
independent tester found tracebacks, endless loops and runs of other lengths than asked)."""
from __future__ import annotations

import argparse
import math


def _number(text: str, kind=float) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"needs a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"needs a finite number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"needs a number above 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"needs 0 or more, got {text!r}")
    return value


def positive_int(text: str) -> int:
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"needs a whole number of 1 or more, got {text!r}")
    return value
