"""The aclserve_device_memory_* gauges had rows only for the devices a loaded model had opened, so
a device the server's models go on by default (model_defaults.devices) had none until a model was
placed there, and its series appeared with it. The server opens those devices at its start (the
first load would), so each has its rows from then on; a device no config names is not opened
(set_device makes the device's default context and stream: resources on a device the server never
uses, maybe another process's), and has none. Real server on a real port, the CPU runtime's two
devices (ACLSERVE_CPU_DEVICES=2, tests/conftest.py)."""
from __future__ import annotations

import asyncio
import os
import shutil
import urllib.request

import pytest

from tests.serving import ServerThread, server_config

from .hostile import wait_for
from .metrics_samples import samples

pytestmark = pytest.mark.skipif(os.environ.get("ACLSERVE_CPU_DEVICES") != "2",
                                reason="needs two devices (ACLSERVE_CPU_DEVICES=2, set by tests/conftest.py)")

FAMILIES = ("aclserve_device_memory_used_bytes", "aclserve_device_memory_total_bytes",
            "aclserve_device_memory_reserve_bytes")


@pytest.fixture
def double_on_device_0(models_dir, tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(models_dir / "double.om", folder / "double.om")
    (folder / "double.yaml").write_text("devices: [0]\n")  # its own placement: device 0 only
    return folder


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{url}/v2/models/double/ready", timeout=30) as answer:
            return answer.status == 200
    except OSError:
        return False


def _device_rows(config) -> tuple[dict, set]:
    """{family: {device: value}} once the model is ready, and the devices its instances are on."""
    with ServerThread(config) as srv:
        asyncio.run(wait_for(lambda: _ready(srv.url), limit_s=60))
        found = samples(urllib.request.urlopen(f"http://{srv.url}/metrics", timeout=30).read().decode())
    rows = {family: {s.labels["device"]: s.value for s in found.get(family, [])} for family in FAMILIES}
    placed = {s.labels["device"] for s in found["aclserve_compute_busy_ratio"] if s.labels["model"] == "double"}
    return rows, placed


def test_every_device_the_models_go_on_by_default_has_memory_rows(double_on_device_0):
    rows, placed = _device_rows(server_config(double_on_device_0, model_defaults={"devices": [0, 1]}))
    assert placed == {"0"}
    for family in FAMILIES:
        assert set(rows[family]) == {"0", "1"}, (family, rows)
    assert rows["aclserve_device_memory_total_bytes"]["1"] > 0
    # device 1 holds no model: nothing is used there; the reserve is a share of its total
    assert rows["aclserve_device_memory_used_bytes"]["1"] < rows["aclserve_device_memory_used_bytes"]["0"]
    assert 0 < rows["aclserve_device_memory_reserve_bytes"]["1"] < rows["aclserve_device_memory_total_bytes"]["1"]


def test_a_device_no_config_names_is_not_opened(double_on_device_0):
    rows, placed = _device_rows(server_config(double_on_device_0))  # model_defaults.devices: [0]
    assert placed == {"0"}
    for family in FAMILIES:
        assert set(rows[family]) == {"0"}, (family, rows)
