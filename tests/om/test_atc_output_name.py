"""ATC's output names near the filesystem's limit on a file name (255 bytes on most): ATC names
the OM of a model that carries its operators' code `<stem>_<os>_<arch>.om` (GE's ModelHelper
inserts "_" + host_env_os + "_" + host_env_cpu), so an output whose own name fit while ATC's did
not failed at the end of ATC's build (File name too long), which may take minutes. It is refused
before ATC runs, in one line (exit 2); the longest name whose ATC names fit is built."""
from __future__ import annotations

import os

from .conftest import run_cli

SUFFIX = "_linux_" + os.uname().machine  # (the stand-in's, as ATC's on this host)
LIMIT = 255


def _compile(model, out, atc):
    return run_cli("compile", model, "-o", out, "--atc", atc, "--soc-version", "Ascend310P3")


def test_an_output_name_atc_could_not_write_is_refused_before_it_runs(tmp_path, fake_atc, static_onnx, monkeypatch):
    atc, record = fake_atc
    monkeypatch.setenv("FAKE_ATC_MODE", "os_specific")
    out = tmp_path / "out"
    out.mkdir()
    assert os.pathconf(out, "PC_NAME_MAX") == LIMIT
    longest = LIMIT - len(SUFFIX) - len(".om")  # the longest stem whose ATC names fit
    fits = out / f"{'a' * longest}.om"
    built = _compile(static_onnx, fits, atc)
    assert built.returncode == 0, built.stderr
    assert sorted(p.name for p in out.iterdir()) == [fits.name] and record.exists()
    record.unlink()
    for stem in ("b" * (longest + 1), "\u00e9" * ((longest + 1) // 2 + 1), "c" * (LIMIT - len(".om"))):
        refused = _compile(static_onnx, out / f"{stem}.om", atc)
        said = refused.stderr
        assert refused.returncode == 2 and said.count("\n") == 1, said
        assert said.startswith(f"aclserve compile: error: output name too long for ATC: it names the OM of a model "
                               f"that carries its operators' code <name>{SUFFIX}.om"), said
        most, given = LIMIT - len(SUFFIX), len(stem.encode()) + len(".om")
        assert f"shorten the output name to {most} bytes at most (it is {given})" in said
        assert not record.exists() and sorted(p.name for p in out.iterdir()) == [fits.name]  # ATC never ran
