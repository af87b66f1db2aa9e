"""tools/bench_runtime.py measures one gear as it measures several (a tester, t80: `--gears 8`, or
`--idle --gears 4`, ended in "could not broadcast input array from shape (8,8,3,64,64) into shape
(8,3,64,64)": one gear compiles a static model, whose input shape has the batch's rows already,
and the tool's request put the gear before it again; gear 1 alone hid it)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests import REPO


@pytest.mark.parametrize("options", [["--gears", "8"], ["--idle", "--gears", "4"]], ids=" ".join)
def test_a_single_gear_is_measured(options, tmp_path):
    run = subprocess.run([sys.executable, str(REPO / "tools" / "bench_runtime.py"), *options, "--seconds", "0.05"],
                         env=dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(REPO)), capture_output=True,
                         text=True, timeout=100)
    assert (run.returncode, run.stderr) == (0, ""), run.stderr
    rows = [line.split() for line in run.stdout.splitlines()]
    assert [row[0] for row in rows if row and row[0].isdigit()] == [options[-1]], run.stdout
    assert os.listdir(tmp_path) == []
