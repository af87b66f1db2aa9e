"""The Python API's arguments checked before anything is built: a wrong type or value is one
ValueError / TypeError naming the argument (they failed deep inside, as "can't multiply sequence
by non-int" for slots=1.5, some after claiming device memory)."""
from __future__ import annotations

import numbers
import os
import threading
from typing import Mapping, Sequence

import numpy as np

from .acl_runtime import MAX_CPU_THREADS
from .limits import MAX_INSTANCES, MAX_SLOTS
from .warmup import WARMUP_DATA

DEVICES = ("auto", "cpu", "npu")


def check_options(**given) -> None:
    for name, value in given.items():
        _CHECKS[name](name, value)


def _whole(name: str, value, minimum: int = 1, maximum: int | None = None, optional: bool = False) -> None:
    """An int from `minimum` to `maximum` (None: no bound, as the server's config has none there)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if maximum is None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    if maximum is not None and not minimum <= value <= maximum:
        raise ValueError(f"{name} must be from {minimum} to {maximum}, got {value}")


def _device(name: str, value) -> None:
    if value not in DEVICES or not isinstance(value, str):
        raise ValueError(f"{name} must be one of {', '.join(DEVICES)}, got {value!r}")


def _fraction(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not 0 <= value < 1:  # (NaN fails it too)
        raise ValueError(f"{name} must be at least 0 and below 1, got {value}")


def _seconds(name: str, value) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds or None, got {value!r}")
    if not 0 <= value <= threading.TIMEOUT_MAX:  # (NaN fails it too; threading's waits take no more)
        raise ValueError(f"{name} must be a number of seconds from 0 to {threading.TIMEOUT_MAX:.0f}, or None, "
                         f"got {value}")


def _flag(name: str, value) -> None:
    if not isinstance(value, (bool, np.bool_, numbers.Integral)) or value not in (0, 1):  # ("no" is true:
        raise TypeError(f"{name} must be True or False, got {value!r}")                  # the warm-up ran)


def _warmup_data(name: str, value) -> None:
    if not isinstance(value, str) or value not in WARMUP_DATA:
        raise ValueError(f"{name} must be one of {', '.join(WARMUP_DATA)}, got {value!r}")


def _path(name: str, value) -> None:
    if not isinstance(value, (str, os.PathLike)) or isinstance(os.fspath(value), bytes):
        raise TypeError(f"{name} must be a str or os.PathLike naming an OM file, got {value!r}")
    text = os.fspath(value)
    if not text or "\0" in text:
        raise ValueError(f"{name} must name an OM file, got {text!r}")


def _name(name: str, value) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"{name} must be a non-empty str or None, got {value!r}")


def _devices(name: str, value) -> None:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
        raise TypeError(f"{name} must be a non-empty list or tuple of device ids, got {value!r}")
    for device in value:
        _whole(f"{name} entry", device, minimum=0)
    ids = [int(device) for device in value]  # (numpy integers shown as plain ones)
    if repeated := sorted({device for device in ids if ids.count(device) > 1}):
        # as the server's config refuses them (config/checks.int_list): each instance goes on the listed device
        # holding the fewest instances (builder._placed)
        raise ValueError(f"{name} has duplicates: {ids} names device{'s' if len(repeated) > 1 else ''} "
                         f"{', '.join(map(str, repeated))} more than once; list each device once (each instance goes "
                         f"on the one of them holding the fewest instances)")


def _value_ranges(name: str, value) -> None:
    """None, or {input name: (smallest, largest)}: as a model's YAML gives `value_range`."""
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a mapping of input name to (smallest, largest), got {value!r}")
    for key, pair in value.items():
        where = f"{name}[{key!r}]"
        if not isinstance(key, str):
            raise TypeError(f"{name} keys must be input names (str), got {key!r}")
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise TypeError(f"{where} must be (smallest, largest), two ints, got {pair!r}")
        for bound in pair:
            if isinstance(bound, (bool, np.bool_)) or not isinstance(bound, numbers.Integral):
                raise TypeError(f"{where} must be (smallest, largest), two ints, got {pair!r}")
        if pair[0] > pair[1]:
            raise ValueError(f"{where}: smallest {pair[0]} is above largest {pair[1]}")


_CHECKS = {
    "device": _device,
    "cpu_threads": lambda name, value: _whole(name, value, maximum=MAX_CPU_THREADS, optional=True),
    "memory_reserve_fraction": _fraction,
    "path": _path,
    "name": _name,
    "instances": lambda name, value: _whole(name, value, maximum=MAX_INSTANCES),
    "devices": _devices,
    "slots": lambda name, value: _whole(name, value, maximum=MAX_SLOTS),
    "timeout": _seconds,
    "retry": _flag,
    "warmup": _flag,
    "warmup_data": _warmup_data,
    "value_ranges": _value_ranges,
}
