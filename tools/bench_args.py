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
        what = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"needs {what}, got {text!r}") from None
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


def fraction(text: str) -> float:
    value = _number(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"needs a fraction from 0 to 1, got {text!r}")
    return value


def positive_int(text: str) -> int:
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"needs a whole number of 1 or more, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"needs a whole number of 0 or more, got {text!r}")
    return value


def whole_seconds(text: str) -> int:
    """A window for wrk, which takes whole seconds: above 0, a fraction rounded up (2.5 -> 3)."""
    return math.ceil(positive_float(text))


def whole_seconds_or_none(text: str) -> int:
    """A warm-up for wrk: 0 for none, else as whole_seconds."""
    return math.ceil(non_negative_float(text))


def _listed(text: str, one) -> list:
    values = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        try:
            values.append(one(item))
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"{e} (in {text!r})" if "," in text else str(e)) from None
    if not values:
        raise argparse.ArgumentTypeError(f"needs one value or more, comma-separated, got {text!r}")
    return values


def positive_ints(text: str) -> list[int]:
    """"1,16,64" -> [1, 16, 64]."""
    return _listed(text, positive_int)


def positive_floats(text: str) -> list[float]:
    """"0.8,1.2" -> [0.8, 1.2]."""
    return _listed(text, positive_float)


def names_of(choices: tuple[str, ...]):
    """A type for a comma-separated subset of `choices`: "a,b" -> ["a", "b"]; a name not among
    them is refused naming them (a tool ran none of its cases, or started its server first)."""
    def one(name: str) -> str:
        if name not in choices:
            raise argparse.ArgumentTypeError(f"unknown {name!r} (choose from {', '.join(choices)})")
        return name
    return lambda text: _listed(text, one)


def positive_ints_or_none(text: str) -> list[int]:
    """As positive_ints; '' for none."""
    return positive_ints(text) if text.strip() else []


def positive_floats_or_none(text: str) -> list[float]:
    """As positive_floats; '' for none."""
    return positive_floats(text) if text.strip() else []


def cpu_list(text: str) -> str:
    """A taskset CPU list ("1", "0,2", "0-3"), as given."""
    for part in text.split(","):
        low, dash, high = part.partition("-")
        if not (low.isdigit() and (high.isdigit() if dash else True) and int(low) <= int(high or low)):
            raise argparse.ArgumentTypeError(f"needs CPU numbers as taskset takes them (1, 0,2 or 0-3), got {text!r}")
    return text
