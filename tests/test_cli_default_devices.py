"""`model_defaults: {devices: [1]}` on a host of one device started the server, which listened, and
then every model's load failed (a tester, t92). A device of model_defaults.devices the host has not
now stops `aclserve serve` before it listens: one line naming the key, the devices and those the
host has, exit 2, as other bad configs. (A model's own `devices` naming one stays that model's
problem: tests/repository/test_settings_that_do_not_fit.py.) So does images.dvpp_device under
images.decoder dvpp. The CPU runtime's device count is
ACLSERVE_CPU_DEVICES; a device host's comes from acl.rt.get_device_count alike."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.processes import leashed_popen


@pytest.mark.parametrize("host_devices, section, said", [
    ("1", "model_defaults:\n  devices: [1]",
     "model_defaults.devices: device 1 does not exist (the host has 1 device: 0)"),
    ("2", "model_defaults:\n  devices: [3, 0, 5]",
     "model_defaults.devices: devices 3, 5 do not exist (the host has 2 devices: 0, 1)"),
    # DVPP's device: its pictures went to Pillow with a WARNING at the first one, the setting of no use
    ("1", "images:\n  decoder: dvpp\n  dvpp_device: 1",
     "images.dvpp_device: device 1 does not exist (the host has 1 device: 0)"),
])
def test_serve_refuses_a_default_device_the_host_lacks_before_it_listens(tmp_path, host_devices, section, said):
    (tmp_path / "models").mkdir()
    (tmp_path / "s.yaml").write_text(f"port: 0\ngrpc_port: 0\n{section}\n")
    env = dict(os.environ, ACLSERVE_CPU_DEVICES=host_devices)
    proc = leashed_popen([sys.executable, "-m", "aclserve", "serve", "--config", "s.yaml", "--device", "cpu"],
                         cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in proc.stderr:  # until it exits (its stderr ends) or says it listens
            lines.append(line.rstrip("\n"))
            if "listening on" in line:
                break
    finally:
        proc.terminate()  # (this server's own child process, started above; a no-op once it has exited)
        proc.stderr.close()
        status = proc.wait(timeout=60)
    assert not any("listening on" in line for line in lines), lines
    assert status == 2, lines
    assert lines[-1] == f"aclserve serve: error: bad configuration: s.yaml: {said}", lines
    assert not any("Traceback" in line for line in lines), lines
