"""The product family of an Ascend SoC name, as CANN's documentation sorts its rules: the one place
the server and the CPU runtime sort a name, so that no two per-SoC rules (DVPP's strides and sizes,
stream limits, stream_abort, AIPP's padded width, untimed event waits) take it for different chips.

Names are acl.get_soc_name's and ATC's --soc_version's ("Ascend310P3", "Ascend910B1"), sorted as
CANN's own map from a SoC to its short SoC does (msOpGen's SOC_TO_SHORT_SOC_MAP: ascend910a, 910b,
910proa, 910prob and 910premiuma -> ascend910; ascend910b1..b4 -> ascend910b; ascend910_93xx ->
ascend910_93), in any case as that map lowers them: "Ascend910B" is a first-generation training
chip, not an A2 (Ascend910B1..), although its name begins like theirs."""
from __future__ import annotations

import enum
import re


class SocFamily(enum.Enum):
    ATLAS_200_300_500 = "Atlas 200/300/500 (Ascend310)"
    ATLAS_INFERENCE = "Atlas inference series (Ascend310P)"
    ATLAS_200I_500_A2 = "Atlas 200I/500 A2 (Ascend310B)"
    ATLAS_TRAINING = "Atlas training series (Ascend910, 910A/B, 910ProA/B, 910PremiumA)"
    ATLAS_A2 = "Atlas A2 (Ascend910B1..B4)"
    ATLAS_A3 = "Atlas A3 (Ascend910_93..)"


# the first-generation training chips, each named whole (a prefix would take "Ascend910B" for the A2's)
_TRAINING_SERIES = frozenset(("ascend910", "ascend910a", "ascend910b", "ascend910proa", "ascend910prob",
                              "ascend910premiuma"))
_PATTERNS = (
    (SocFamily.ATLAS_A2, re.compile(r"ascend910b\d.*")),  # B1..B4, B2C, B4-1
    (SocFamily.ATLAS_A3, re.compile(r"ascend910_93.*")),
    (SocFamily.ATLAS_INFERENCE, re.compile(r"ascend310p.*")),  # P1..P7, and their vir0N shares
    (SocFamily.ATLAS_200I_500_A2, re.compile(r"ascend310b.*")),
    (SocFamily.ATLAS_200_300_500, re.compile(r"ascend310")),
)


def soc_family(soc_name: str | None) -> SocFamily | None:
    """The family of a SoC name; None for no name and for one CANN's documents do not sort (the CPU
    runtime's CPU-ORT, a chip newer than these): each rule then takes its own cautious default."""
    name = (soc_name or "").lower()
    if name in _TRAINING_SERIES:
        return SocFamily.ATLAS_TRAINING
    return next((family for family, pattern in _PATTERNS if pattern.fullmatch(name)), None)
