"""Settings of the CPU runtime, read from the environment when `acl.init` runs.

ACLSERVE_CPU_DEVICES        number of devices (default 1)
ACLSERVE_CPU_DEVICE_MEMORY  capacity of each device: bytes, or a number with K/M/G/T (binary
                            units, optional "i"/"B": "512M", "8GiB"); default 8G, at most 1024T
ACLSERVE_CPU_THREADS        ONNX Runtime intra-op threads per loaded model (default 1);
                            `set_threads(n)` overrides it for models loaded afterwards
ACLSERVE_CPU_MAX_STREAMS    streams per device, default the figure CANN documents for the SoC it
                            presents (soc_limits.py: 310/310P 1024, 310B 512, the A2/A3's 910B1..
                            and 910_93.. 1984, the training series' 910, 910A/B, 910ProA/B and
                            910PremiumA 2048; CPU-ORT and an Ascend name not documented: 1024), at
                            most 2048 (910, the most of any SoC); every context's streams (2 on the
                            310-class SoCs and a name not documented, 1 on the 910 families and
                            CPU-ORT: soc_limits.context_streams) and one internal stream count, as
                            on the device
ACLSERVE_CPU_MAX_EVENTS     events per device, default likewise the SoC's (310/310P 1023, 310B
                            and 910-class 65535; CPU-ORT: 1023), at most 65535 (as many as any
                            SoC allows)
ACLSERVE_CPU_SOC            the SoC it presents (acl.get_soc_name) and whose rules it follows,
                            default CPU-ORT (none); Ascend310 (Atlas 200/300/500) refuses a timed
                            event wait, as that SoC does, and stream_abort is taken by CPU-ORT and
                            the A2/A3 only (soc_families.py); CPU-ORT or an Ascend name (Ascend...)
ACLSERVE_CPU_RUN_MODE       host (default: the application on a host, the card over PCIe) or
                            device (on the board's own CPU, as an Atlas 200 DK: get_run_mode
                            answers ACL_DEVICE and malloc_host's memory is the device's, 16-byte
                            aligned only, as the device's normal pages need not be 64-byte aligned)
ACLSERVE_CPU_LACKS          pyACL calls to leave out, as an older CANN release lacks them
                            (comma-separated, of OPTIONAL_CALLS): the runtime then has no such
                            attribute, so the server's fallbacks (acl/compat.py) run for real
ACLSERVE_CPU_FAULTS         fault injection, see faults.py
ACLSERVE_CPU_CHECK_HOST     1: a memcpy_async whose host side was written between the call and
                            the copy fails (107000) as it runs, and a D2H destination reads 0xFF
                            until its copy ran (a memset_async's host memory alike: _async_host.py);
                            0 (default): neither
(the names, for the CLI's warning of others: acl/cpu_environment.py)
"""
from __future__ import annotations

import os
import re
from fractions import Fraction

from ..soc_limits import CPU_RUNTIME_SOC, MAX_EVENTS, MAX_STREAMS, limits_for_soc

DEFAULT_DEVICES = 1
MAX_DEVICES = 64  # more than any Ascend host has (8 or 16 NPUs): each is a device the runtime builds
MAX_THREADS = 1024  # ONNX Runtime threads per session, as cpu_threads (runtime/acl_runtime.MAX_CPU_THREADS)
DEFAULT_DEVICE_MEMORY = 8 << 30
# far more than any device has (an Atlas A2's 64 GB): 10**35G was taken, /metrics showing 1.07e+44 bytes
MAX_DEVICE_MEMORY = 1 << 50
DEFAULT_SOC = CPU_RUNTIME_SOC  # "CPU-ORT", not an Ascend SoC: the CPU runtime over ONNX Runtime
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)

# Calls some CANN releases do not have (acl/compat.py falls back without them)
# ("media": the whole acl.media, which a pyACL built without DVPP lacks)
OPTIONAL_CALLS = ("rt.synchronize_event_with_timeout", "rt.synchronize_stream_with_timeout",
                  "rt.create_event_ex_with_flag", "rt.set_stream_failure_mode", "rt.stream_abort", "get_soc_name",
                  "mdl.get_first_aipp_info", "mdl.get_input_dims_v2", "media", "util.bytes_to_ptr")

_threads_override: int | None = None


def parse_size(text: str) -> int:
    """"512M" -> 536870912, "8GiB" -> 8 << 30, "1000" -> 1000, at most MAX_DEVICE_MEMORY. Raises
    ValueError."""
    m = _SIZE.match(str(text))
    if m is None:
        raise ValueError(f"ACLSERVE_CPU_DEVICE_MEMORY is not a size: {text!r} (expected bytes or a number with "
                         f"K/M/G/T, e.g. 8G)")
    whole, _, fraction = m.group(1).partition(".")
    whole = whole.lstrip("0") or "0"
    # exact, as float() was not (400 digits made inf, an OverflowError); 20 digits are past any bound
    size = MAX_DEVICE_MEMORY + 1 if len(whole) > 20 else int(Fraction(f"{whole}.{fraction[:20] or 0}")
                                                               * _UNITS[m.group(2).upper()])
    if size <= 0:
        raise ValueError(f"ACLSERVE_CPU_DEVICE_MEMORY must be positive: {text!r}")
    if size > MAX_DEVICE_MEMORY:
        raise ValueError(f"ACLSERVE_CPU_DEVICE_MEMORY must be at most 1024T (1 PiB: more than any device has), "
                         f"got {text[:40]!r}")
    return size


def _positive_int(name: str, default: int, maximum: int = 2**31 - 1) -> int:
    """A positive integer of at most `maximum` (a C int, as the values they stand for in CANN):
    a huge ACLSERVE_CPU_DEVICES made one device after another until the memory ran out."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= maximum:
        raise ValueError(f"{name} must be an integer from 1 to {maximum}, got {raw[:40]!r}")
    return value


def device_count() -> int:
    return _positive_int("ACLSERVE_CPU_DEVICES", DEFAULT_DEVICES, MAX_DEVICES)


def device_memory() -> int:
    raw = os.environ.get("ACLSERVE_CPU_DEVICE_MEMORY")
    return parse_size(raw) if raw and raw.strip() else DEFAULT_DEVICE_MEMORY


def default_limits() -> tuple[int, int]:
    """(streams, events) a device has when ACLSERVE_CPU_MAX_STREAMS / _EVENTS are not set: those
    CANN documents for the SoC it presents (ACLSERVE_CPU_SOC), so a run that emulates a SoC meets
    that SoC's limits; CPU-ORT's, and an Ascend name's CANN does not document, are soc_limits'
    DEFAULT_LIMITS (the Atlas inference card's 1024 / 1023)."""
    return limits_for_soc(soc_name())


def max_streams() -> int:
    """At most what any SoC allows, as device_limits.streams: more is no device's (a C int's worth was taken)."""
    return _positive_int("ACLSERVE_CPU_MAX_STREAMS", default_limits()[0], MAX_STREAMS)


def max_events() -> int:
    """At most what any SoC allows, as device_limits.events: the CPU runtime presents a device none has."""
    return _positive_int("ACLSERVE_CPU_MAX_EVENTS", default_limits()[1], MAX_EVENTS)


def soc_name() -> str:
    """CPU-ORT in any case, as a named choice; an Ascend name as CANN writes it (case-sensitive: a
    name, not a choice), which get_soc_name answers as given and soc_families.py sorts into its family."""
    raw = os.environ.get("ACLSERVE_CPU_SOC", "").strip()
    if raw.upper() == DEFAULT_SOC:
        return DEFAULT_SOC
    if raw and not re.fullmatch(r"Ascend\w+(-\w+)*", raw):  # (some are hyphenated: Ascend910B4-1)
        raise ValueError(f"ACLSERVE_CPU_SOC must be {DEFAULT_SOC} or a SoC name as CANN gives it "
                         f"(e.g. Ascend310P3), got {raw!r}")
    return raw or DEFAULT_SOC


def run_mode() -> str:
    """host or device, in any case (as the config's named choices are taken)."""
    raw = os.environ.get("ACLSERVE_CPU_RUN_MODE", "").strip() or "host"
    if raw.lower() not in ("host", "device"):
        raise ValueError(f"ACLSERVE_CPU_RUN_MODE must be host or device, got {raw!r}")
    return raw.lower()


def lacks() -> frozenset[str]:
    """The calls named in any case (each is pyACL's lower-case name)."""
    raw = os.environ.get("ACLSERVE_CPU_LACKS", "")
    given = [name for name in (name.strip().lower() for name in raw.split(",")) if name]
    names = frozenset(given)
    unknown = sorted(names - set(OPTIONAL_CALLS))
    if unknown:
        raise ValueError(f"ACLSERVE_CPU_LACKS names {', '.join(unknown)}: it may leave out "
                         f"{', '.join(OPTIONAL_CALLS)}")
    twice = sorted(name for name in names if given.count(name) > 1)  # (as a list's duplicates are refused)
    if twice:
        raise ValueError(f"ACLSERVE_CPU_LACKS names {', '.join(twice)} more than once: name each call once")
    return names


def check_host() -> bool:
    raw = os.environ.get("ACLSERVE_CPU_CHECK_HOST", "").strip() or "0"
    if raw not in ("0", "1"):
        raise ValueError(f"ACLSERVE_CPU_CHECK_HOST must be 0 or 1, got {raw[:40]!r}")
    return raw == "1"


def set_threads(n: int) -> None:
    """Intra-op threads for models loaded from now on (None: back to ACLSERVE_CPU_THREADS)."""
    global _threads_override
    if n is not None and (not isinstance(n, int) or n < 1):
        raise ValueError(f"threads must be a positive int, got {n!r}")
    _threads_override = n


def check_environment(threads_too: bool = True) -> None:
    """Every setting above read once: ValueError naming the first that is wrong (a server checks
    them at its start, not when acl.init meets them). `threads_too=False`: ACLSERVE_CPU_THREADS
    left out, for a caller whose runtime sets the threads itself (serve's cpu_threads: set_threads)."""
    from . import faults
    for read in (device_count, device_memory, soc_name, max_streams, max_events, threads, run_mode, lacks,
                 check_host):
        if threads_too or read is not threads:
            read()
    spec = os.environ.get("ACLSERVE_CPU_FAULTS", "")
    if spec.strip():
        faults.parse(spec)


def threads() -> int:
    if _threads_override is not None:
        return _threads_override
    return _positive_int("ACLSERVE_CPU_THREADS", 1, MAX_THREADS)
