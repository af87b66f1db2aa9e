"""Streams and events one device allows, by SoC (CANN docs, aclrtCreateStream and
aclrtCreateEvent): what the runtime's ledger counts against (runtime/limits.py), what the CPU
runtime presents (cpu/settings.py), and the most a setting of either may claim; and the streams
a created context holds (aclrtCreateContext), which count against that limit."""
from __future__ import annotations

from ..soc_families import SocFamily, soc_family

# (streams, events) a device of each family allows, from the CANN documentation (aclrtCreateStream's
# "Stream最大数": training series 2048, A2/A3 1984, 200I/500 A2 512, inference 1024)
SOC_LIMITS: dict[SocFamily, tuple[int, int]] = {
    SocFamily.ATLAS_INFERENCE: (1024, 1023),  # Ascend310P
    SocFamily.ATLAS_200I_500_A2: (512, 65535),  # Ascend310B
    SocFamily.ATLAS_A2: (1984, 65535),  # Ascend910B1..B4
    SocFamily.ATLAS_A3: (1984, 65535),  # Ascend910_93..
    SocFamily.ATLAS_TRAINING: (2048, 65535),  # Ascend910, 910A/B, 910ProA/B, 910PremiumA
    SocFamily.ATLAS_200_300_500: (1024, 1023),  # Ascend310
}
DEFAULT_LIMITS = (1024, 1023)  # the most constrained documented inference card
# No documented device allows more (the training series' 2048 streams, 65535 events): a larger
# figure is no device's, and a ledger counting against it lets through what none holds.
MAX_STREAMS = max(streams for streams, _ in SOC_LIMITS.values())
MAX_EVENTS = max(events for _, events in SOC_LIMITS.values())


# CANN's aclrtCreateContext (8.0.RC3, 8.1.RC1): "对于Atlas 推理系列产品，在标准形态下，该Context中包含
# 2个Stream，1个默认Stream和1个执行内部同步的Stream", the same for the Atlas 200/300/500 and 200I/500 A2;
# the training series and the A2/A3 hold "1个默认Stream". aclrtCreateStream counts both against the
# limit ("N = Stream最大数 - 已存在的Stream数", the internal ones included).
CPU_RUNTIME_SOC = "CPU-ORT"  # what the CPU runtime presents unless told to present an Ascend SoC
ONE_STREAM_FAMILIES = (SocFamily.ATLAS_TRAINING, SocFamily.ATLAS_A2, SocFamily.ATLAS_A3)


def context_streams(soc_name: str | None) -> int:
    """Streams a context made by create_context holds on this SoC: its default stream, and one
    for internal synchronisation on the Atlas inference products (Ascend310, 310P, 310B) and on
    a SoC not known (an older CANN that cannot name it: counted as the inference card that
    DEFAULT_LIMITS is). set_device's default context and the device's internal stream make 2 on
    every SoC (aclrtCreateStream's example: 1024 less those 2 leaves 1022 to create)."""
    # (CPU-ORT, the CPU runtime's own, has no SoC's internal stream)
    return 1 if soc_name == CPU_RUNTIME_SOC or soc_family(soc_name) in ONE_STREAM_FAMILIES else 2


def documented_limits(soc_name: str | None) -> tuple[int, int] | None:
    """(streams, events) per device the CANN docs give for a SoC name such as "Ascend310P3",
    None for a SoC they do not name."""
    family = soc_family(soc_name)
    return None if family is None else SOC_LIMITS[family]


def limits_for_soc(soc_name: str | None) -> tuple[int, int]:
    """(streams, events) per device for a SoC name: documented, else DEFAULT_LIMITS."""
    return documented_limits(soc_name) or DEFAULT_LIMITS
