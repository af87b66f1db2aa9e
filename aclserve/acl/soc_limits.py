"""Streams and events one device allows, by SoC (CANN docs, aclrtCreateStream and
aclrtCreateEvent): what the runtime's ledger counts against (runtime/limits.py), what the CPU
runtime presents (cpu/settings.py), and the most a setting of either may claim."""
from __future__ import annotations

# (SoC name prefix, streams, events) from the CANN documentation; first match wins.
SOC_LIMITS: tuple[tuple[str, int, int], ...] = (
    ("Ascend310P", 1024, 1023),   # Atlas inference series
    ("Ascend310B", 512, 65535),   # Atlas 200I/500 A2
    ("Ascend910B", 1984, 65535),  # Atlas A2
    ("Ascend910_93", 1984, 65535),  # Atlas A3
    ("Ascend910", 2048, 65535),   # Atlas training series
    ("Ascend310", 1024, 1023),    # Atlas 200/300/500
)
DEFAULT_LIMITS = (1024, 1023)  # the most constrained documented inference card
# No documented device allows more (the training series' 2048 streams, 65535 events): a larger
# figure is no device's, and a ledger counting against it lets through what none holds.
MAX_STREAMS = max(streams for _, streams, _ in SOC_LIMITS)
MAX_EVENTS = max(events for _, _, events in SOC_LIMITS)


def limits_for_soc(soc_name: str | None) -> tuple[int, int]:
    """(streams, events) per device for a SoC name such as "Ascend310P3"."""
    for prefix, streams, events in SOC_LIMITS:
        if soc_name and soc_name.startswith(prefix):
            return streams, events
    return DEFAULT_LIMITS
