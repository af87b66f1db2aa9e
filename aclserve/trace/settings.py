"""Trace settings as Triton's trace extension names them, global and per model.

    trace_level    ["OFF"] or ["TIMESTAMPS"] (TENSORS is refused: tensors are not traced)
    trace_rate     "N": one request in N is traced (per model)
    trace_count    "N": traces left to collect; "-1" = no limit (counts down, like Triton's)
    log_frequency  "N": write the file every N traces (to trace_file.0, .1, ...); "0" = when
                   tracing leaves it (level OFF, a new trace_file, the count spent, shutdown),
                   each write appended to the file (Tracer)
    trace_file     where traces are written; "" = none (refused with a level other than OFF
                   through the API; start-up settings keep the traces in memory, for take())
    trace_format   aclserve's own: "chrome" (Chrome trace / Perfetto JSON, the default) or
                   "triton" (Triton's trace JSON, for tools written against it)
    trace_mode     Triton's: "triton" (read back so; OpenTelemetry, its other mode, is refused)

Values travel as strings (trace_level as a list), as in Triton's trace extension. A model's
settings are the global ones with those the model set itself (Tracer): a setting it never set,
or cleared with a null value, follows the global one, also as the global one changes later; an
update with no settings clears all of the model's own. A null in a global update restores that
setting's value at start-up.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

LEVELS = ("OFF", "TIMESTAMPS")
FORMATS = ("chrome", "triton")
# every setting by its key, with the TraceSettings field it sets: the keys taken, read back and named
# when an unknown one is refused (trace_mode sets none: "triton" is the one mode)
SETTINGS = {"trace_level": "level", "trace_rate": "rate", "trace_count": "count", "log_frequency": "log_frequency",
            "trace_file": "file", "trace_format": "format", "trace_mode": None}
KEYS = tuple(SETTINGS)
MAX_RATE = (1 << 31) - 1  # Triton's largest (an int32's)
MAX_LEVELS = 16  # values a trace_level list may hold (Triton's levels are OFF, TIMESTAMPS, TENSORS)


class TraceSettingsError(ValueError):
    """A trace setting that cannot be applied; the message names the setting."""


@dataclass(frozen=True)
class TraceSettings:
    level: str = "OFF"
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""
    format: str = "chrome"

    @property
    def on(self) -> bool:
        return self.level != "OFF" and self.count != 0

    def as_triton(self) -> dict:
        return {"trace_level": [self.level], "trace_rate": str(self.rate), "trace_count": str(self.count),
                "log_frequency": str(self.log_frequency), "trace_file": self.file,
                "trace_format": self.format, "trace_mode": "triton"}

    def updated(self, changes: dict, base: "TraceSettings | None" = None) -> "TraceSettings":
        """These settings with `changes` (Triton's JSON) applied; a None value takes the setting
        from `base`, or its default without one."""
        fallback = base or TraceSettings()
        fields = {name: getattr(fallback, name) if value is None else value
                  for name, value in parse_changes(changes).items()}
        return dataclasses.replace(self, **fields)


def parse_changes(changes: dict) -> dict:
    """Triton's trace-setting JSON as {field: value}, None for a null (a setting cleared).
    Raises TraceSettingsError naming the setting."""
    if not isinstance(changes, dict):
        raise TraceSettingsError("trace settings must be a JSON object")
    fields = {}
    for key, value in changes.items():
        if key not in SETTINGS:
            raise TraceSettingsError(f"unknown trace setting '{key}' (known: {', '.join(KEYS)})")
        if key == "trace_mode":
            if value not in (None, "triton", ["triton"]):
                raise TraceSettingsError("trace_mode: only 'triton' is supported")
            continue
        fields[SETTINGS[key]] = None if value is None else _parse(key, value)
    return fields


def _one(key: str, value) -> str:
    if isinstance(value, list):
        if len(value) != 1:
            raise TraceSettingsError(f"{key}: expected one value, got {len(value)}")
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TraceSettingsError(f"{key}: expected a string, got {type(value).__name__}")
    return str(value)


_INTEGER = re.compile(r"[+-]?[0-9]+")  # (int() takes "1_000" and other scripts' digits too)


def _int(key: str, value, minimum: int) -> int:
    text = _one(key, value).strip()
    if not _INTEGER.fullmatch(text) or len(text) > 40:
        raise TraceSettingsError(f"{key}: expected an integer, got {text[:40]!r}")
    number = int(text)
    if number < minimum or number > MAX_RATE:
        raise TraceSettingsError(f"{key}: must be between {minimum} and {MAX_RATE}, got {number}")
    return number


def _parse(key: str, value):
    if key == "trace_level":
        levels = value if isinstance(value, list) else [value]
        if len(levels) > MAX_LEVELS:  # each is read in Python: a gRPC message holds 500,000
            raise TraceSettingsError(f"trace_level: expected OFF or TIMESTAMPS, got {len(levels):,} values")
        given = [_one(key, v) for v in levels]
        names = {level.upper() for level in given}
        if "TENSORS" in names:
            raise TraceSettingsError("trace_level: TENSORS is not supported (timestamps only)")
        unknown = dict.fromkeys(level for level in given if level.upper() not in LEVELS)
        if unknown or not names:
            # as written ("abc" was said ABC), each quoted and cut as trace_format's is
            got = ", ".join(repr(level[:40]) for level in unknown) if unknown else "no level"
            raise TraceSettingsError(f"trace_level: expected OFF or TIMESTAMPS, got {got}")
        if "OFF" in names and len(names) > 1:  # (it was taken as TIMESTAMPS; Triton refuses it too)
            raise TraceSettingsError("trace_level: OFF must be the only level given")
        return "TIMESTAMPS" if "TIMESTAMPS" in names else "OFF"
    if key == "trace_rate":
        return _int(key, value, 1)
    if key == "trace_count":
        return _int(key, value, -1)
    if key == "log_frequency":
        return _int(key, value, 0)
    if key == "trace_format":
        text = _one(key, value).lower()
        if text not in FORMATS:
            raise TraceSettingsError(f"trace_format: expected chrome or triton, got {text[:40]!r}")
        return text
    text = _one(key, value)
    if not text.isprintable() or len(text) > 4096:  # a control character: no file name anyone meant
        raise TraceSettingsError("trace_file: not a usable path")
    return text
