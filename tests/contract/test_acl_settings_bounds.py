"""The CPU runtime's settings past what they can mean are refused (ValueError, which `serve` and
`profile` say in one line at start, as every other bad ACLSERVE_CPU_* value): a device memory
past any device's, and a call ACLSERVE_CPU_LACKS names twice (a tester, t92); a SoC name as CANN
writes it is taken, hyphenated ones too."""
from __future__ import annotations

import pytest

from aclserve.acl.cpu import settings


@pytest.mark.parametrize("value, said", [
    # (taken: /metrics then showed 1.07e+44 bytes)
    (f"{10**35}G", f"ACLSERVE_CPU_DEVICE_MEMORY must be at most 1024T (1 PiB: more than any device has), got "
                   f"'{10**35}G'"),
    ("1025T", "ACLSERVE_CPU_DEVICE_MEMORY must be at most 1024T"),
    ("9" * 400, "ACLSERVE_CPU_DEVICE_MEMORY must be at most 1024T"),  # (float() made it inf: an OverflowError)
], ids=["10**35G", "1025T", "400 digits"])
def test_a_device_memory_past_any_devices_is_refused(monkeypatch, value, said):
    monkeypatch.setenv("ACLSERVE_CPU_DEVICE_MEMORY", value)
    with pytest.raises(ValueError) as info:
        settings.check_environment()
    assert str(info.value).startswith(said), str(info.value)


def test_the_largest_device_memory_is_taken_exactly():
    assert settings.parse_size("1024T") == settings.MAX_DEVICE_MEMORY == 1 << 50
    assert settings.parse_size("1.5K") == 1536 and settings.parse_size(f"{'0' * 5000}8G") == 8 << 30


def test_a_call_named_twice_in_acl_cpu_lacks_is_refused(monkeypatch):
    """`media,media` was taken as `media` once, in silence; a list's duplicates are refused elsewhere."""
    monkeypatch.setenv("ACLSERVE_CPU_LACKS", "media, rt.stream_abort, Media")
    with pytest.raises(ValueError, match="^ACLSERVE_CPU_LACKS names media more than once: name each call once$"):
        settings.check_environment()


@pytest.mark.parametrize("name", ["Ascend910B4-1", "Ascend310P3", "Ascend910_9391"])
def test_a_soc_name_as_cann_writes_it_is_presented(monkeypatch, name):
    """A hyphenated name (an A2 variant: Ascend910B4-1, which soc_families sorts as an A2) was refused."""
    monkeypatch.setenv("ACLSERVE_CPU_SOC", name)
    assert settings.soc_name() == name


@pytest.mark.parametrize("name", ["Ascend910B-", "Ascend-", "ascend310", "Ascend310 P"])
def test_a_name_cann_would_not_write_is_refused(monkeypatch, name):
    monkeypatch.setenv("ACLSERVE_CPU_SOC", name)
    with pytest.raises(ValueError, match="^ACLSERVE_CPU_SOC must be CPU-ORT or a SoC name as CANN gives it"):
        settings.soc_name()
