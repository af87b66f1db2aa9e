"""soc_families.py: which product family a SoC name is, the one sorting every per-SoC rule asks
(the server's and the CPU runtime's alike). "Ascend910B" is the first-generation training chip
(CANN's SOC_TO_SHORT_SOC_MAP: ascend910b -> ascend910), not an Atlas A2 (Ascend910B1..B4), though
its name begins as theirs do."""
from __future__ import annotations

import pytest

from aclserve.acl.cpu import _dvpp_limits
from aclserve.images import dvpp
from aclserve.soc_families import SocFamily, soc_family

FAMILIES = {
    SocFamily.ATLAS_TRAINING: ("Ascend910", "Ascend910A", "Ascend910B", "Ascend910ProA", "Ascend910ProB",
                               "Ascend910PremiumA"),
    SocFamily.ATLAS_A2: ("Ascend910B1", "Ascend910B2", "Ascend910B2C", "Ascend910B3", "Ascend910B4", "Ascend910B4-1"),
    SocFamily.ATLAS_A3: ("Ascend910_9391", "Ascend910_9372"),
    SocFamily.ATLAS_INFERENCE: ("Ascend310P1", "Ascend310P3", "Ascend310P3vir02"),
    SocFamily.ATLAS_200I_500_A2: ("Ascend310B1", "Ascend310B4"),
    SocFamily.ATLAS_200_300_500: ("Ascend310",),
}
NOT_SORTED = ("CPU-ORT", "Ascend950PR", "Ascend3100", "unknown", "", None)
EVERY_NAME = [name for names in FAMILIES.values() for name in names] + list(NOT_SORTED)


@pytest.mark.parametrize("family, name", [(family, name) for family, names in FAMILIES.items() for name in names])
def test_each_name_is_of_its_family(family, name):
    assert soc_family(name) is family
    assert soc_family(name.lower()) is family  # as CANN's own map lowers a name


@pytest.mark.parametrize("name", NOT_SORTED)
def test_a_name_no_family_holds_is_none(name):
    assert soc_family(name) is None


@pytest.mark.parametrize("name", EVERY_NAME)
def test_the_server_and_the_cpu_runtime_take_a_soc_for_the_same_dvpp(name):
    """images/dvpp.py and the CPU runtime's _dvpp_limits.py state DVPP's figures each (the emulation
    takes none from the code it checks), and sort the SoC alike: the Ascend910B gets the training
    series' 128-pixel JPEGD stride and 4,096-row VPC output on both, where both gave it the A2's."""
    assert dvpp.jpegd_width_align(name) == _dvpp_limits.jpegd_width_align(name or "")
    assert dvpp.vpc_output(name) == _dvpp_limits.vpc_output(name or "")
    family = soc_family(name)
    assert dvpp.jpegd_width_align(name) == (128 if family in (None, SocFamily.ATLAS_200_300_500,
                                                              SocFamily.ATLAS_TRAINING) else 64)
    tall = family in (SocFamily.ATLAS_200I_500_A2, SocFamily.ATLAS_A2, SocFamily.ATLAS_A3)
    assert dvpp.vpc_output(name)[1] == ((6, 8192) if tall else (6, 4096))
