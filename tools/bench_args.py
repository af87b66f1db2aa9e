"""Option types of the benchmark tools of tools/ (argparse `type=`): a value a run cannot use is
refused before anything starts, in argparse's usage line naming the option, exit status 2 (an
independent tester found tracebacks, endless loops and runs of other lengths than asked)."""
from __future__ import annotations

import argparse
import math
import os


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


def at_least(minimum: float, unit: str = ""):
    """A type for a number of `minimum` or more: "needs 1 s or more", for at_least(1, " s")."""
    def checked(text: str) -> float:
        value = _number(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"needs {minimum:g}{unit} or more, got {text!r}")
        return value
    return checked


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


def _check_allowed(low: int, high: int, text: str) -> None:
    """Refuse CPUs low..high unless this process may use each of them (taskset failed "failed to
    set pid's affinity" after the models were built; sched_setaffinity "[Errno 22] Invalid argument"
    naming no option)."""
    allowed = os.sched_getaffinity(0)
    # (the first one not allowed: a search bounded by the largest allowed, whatever the range)
    refused = next((cpu for cpu in range(low, high + 1) if cpu not in allowed), None)
    if refused is not None:
        raise argparse.ArgumentTypeError(f"CPU {refused} is not one this process may use (it may use "
                                         f"{','.join(map(str, sorted(allowed)))}), got {text!r}")


def cpu_list(text: str) -> str:
    """A taskset CPU list ("1", "0,2", "0-3") of CPUs this process may use, as given."""
    for part in text.split(","):
        low, dash, high = part.partition("-")
        if not (low.isdigit() and (high.isdigit() if dash else True) and int(low) <= int(high or low)):
            raise argparse.ArgumentTypeError(f"needs CPU numbers as taskset takes them (1, 0,2 or 0-3), got {text!r}")
        _check_allowed(int(low), int(high or low), text)
    return text


def cpu_or_none(text: str) -> int | None:
    """One CPU this process may use, to pin to; -1 for none (None)."""
    cpu = _number(text, int)
    if cpu == -1:
        return None
    if cpu < 0:
        raise argparse.ArgumentTypeError(f"needs a CPU number, or -1 for none, got {text!r}")
    _check_allowed(cpu, cpu, text)
    return cpu


def gears(text: str) -> str:
    """Batch sizes for `aclserve compile --batch` ("1,2,4,8"), checked by its own parser before
    anything is built (a bad one failed in the compile, its CalledProcessError quoting the command)."""
    from aclserve.om.compile_error import CompileError
    from aclserve.om.shape_args import parse_gears
    try:
        return ",".join(map(str, parse_gears(text)))
    except CompileError as e:
        raise argparse.ArgumentTypeError(f"{e} (the gears go to aclserve compile --batch)") from None
