"""The CPU runtime's settings with named choices take them in any case, as README says of every
setting with named choices in the environment (ACLSERVE_CPU_RUN_MODE=DEVICE stopped the start, and
ACLSERVE_CPU_FAULTS=EXECUTE:nth=99 was an unknown kind); names stay as written: a fault's model=
(a model's name) and an Ascend SoC name (as CANN writes it)."""
from __future__ import annotations

import pytest

from aclserve.acl.cpu import faults, settings


@pytest.mark.parametrize("name, value, read, taken", [
    ("ACLSERVE_CPU_RUN_MODE", "DEVICE", settings.run_mode, "device"),
    ("ACLSERVE_CPU_RUN_MODE", "Host", settings.run_mode, "host"),
    ("ACLSERVE_CPU_SOC", "cpu-ort", settings.soc_name, "CPU-ORT"),
    ("ACLSERVE_CPU_LACKS", "RT.Stream_Abort, Media", settings.lacks, frozenset({"rt.stream_abort", "media"})),
])
def test_a_named_choice_is_taken_in_any_case(monkeypatch, name, value, read, taken):
    monkeypatch.setenv(name, value)
    assert read() == taken
    settings.check_environment()


def test_a_fault_spec_takes_its_kinds_and_keys_in_any_case_and_a_model_as_named():
    assert faults.parse("EXECUTE:NTH=99,Model=Digits;Memcpy:Count=2") == [
        {"kind": "execute", "nth": 99, "model": "Digits"}, {"kind": "memcpy", "count": 2}]

