"""Streams and events one device allows, by SoC (CANN docs, aclrtCreateStream and
aclrtCreateEvent): what the runtime's ledger counts against (runtime/limits.py), what the CPU
runtime presents (cpu/settings.py), and the most a setting of either may claim; and the streams
a created context holds (aclrtCreateContext), which count against that limit."""
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


# CANN's aclrtCreateContext (8.0.RC3, 8.1.RC1): "对于Atlas 推理系列产品，在标准形态下，该Context中包含
# 2个Stream，1个默认Stream和1个执行内部同步的Stream", the same for the Atlas 200/300/500 and 200I/500 A2;
# the training series and the A2/A3 hold "1个默认Stream". aclrtCreateStream counts both against the
# limit ("N = Stream最大数 - 已存在的Stream数", the internal ones included).
CPU_RUNTIME_SOC = "CPU-ORT"  # what the CPU runtime presents unless told to present an Ascend SoC
# 910: training series, 910B: A2, 910_93: A3; and the CPU runtime's own, which has no SoC's internal stream
ONE_STREAM_CONTEXTS = ("Ascend910", CPU_RUNTIME_SOC)


def context_streams(soc_name: str | None) -> int:
    """Streams a context made by create_context holds on this SoC: its default stream, and one
    for internal synchronisation on the Atlas inference products (Ascend310, 310P, 310B) and on
    a SoC not known (an older CANN that cannot name it: counted as the inference card that
    DEFAULT_LIMITS is). set_device's default context and the device's internal stream make 2 on
    every SoC (aclrtCreateStream's example: 1024 less those 2 leaves 1022 to create)."""
    return 1 if soc_name and soc_name.startswith(ONE_STREAM_CONTEXTS) else 2


def documented_limits(soc_name: str | None) -> tuple[int, int] | None:
    """(streams, events) per device the CANN docs give for a SoC name such as "Ascend310P3",
    None for a SoC they do not name."""
    for prefix, streams, events in SOC_LIMITS:
        if soc_name and soc_name.startswith(prefix):
            return streams, events
    return None


def limits_for_soc(soc_name: str | None) -> tuple[int, int]:
    """(streams, events) per device for a SoC name: documented, else DEFAULT_LIMITS."""
    return documented_limits(soc_name) or DEFAULT_LIMITS
