"""tools/bench_images.py's report: a run whose errors column is not 0 says so and exits 1, as
bench_server.py and bench_overload.py do, and its table names the JPEGs per request the run sent
(found in review: it exited 0 whatever the errors column said, and its header read "4 JPEGs"
whatever --images-per-request was)."""
from __future__ import annotations

import os
import sys

import pytest

from tests import REPO

sys.path.insert(0, os.path.join(REPO, "tools"))

import bench_images  # noqa: E402


def _round(workers: int, errors: int) -> dict:
    """One mode's figures in one round, as run_mode gives them."""
    return {"workers": workers, "images_s": 400.0, "busy": 0.9, "mean_batch": 8.0, "p50_ms": 3.0, "p99_ms": 9.0,
            "probe_p50_ms": 2.0, "batch_p50_ms": 10.0, "errors": errors}


@pytest.mark.parametrize("errors, status", [(0, 0), (3, 1)])
def test_request_errors_fail_the_run(errors, status, capsys):
    args = bench_images.parse_args(["--rounds", "2"])
    runs = {2: [_round(2, 0), _round(2, errors)], 0: [_round(0, 0), _round(0, 0)]}
    assert bench_images.report(args, runs, 1.0, 0.7) == status
    out, err = capsys.readouterr()
    pool = next(line for line in out.splitlines() if line.startswith("| pool, 2 threads |"))
    assert pool.endswith(f"| {errors} |"), out
    assert err == (f"\nFAIL: {errors} request errors (see the errors column)\n" if errors else ""), err


@pytest.mark.parametrize("per_request, named", [(4, "4 JPEGs"), (2, "2 JPEGs"), (1, "1 JPEG")])
def test_the_table_names_the_jpegs_per_request_sent(per_request, named, capsys):
    args = bench_images.parse_args(["--rounds", "1", "--images-per-request", str(per_request)])
    bench_images.report(args, {2: [_round(2, 0)], 0: [_round(0, 0)]}, 1.0, 0.7)
    header = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| decoding |"))
    assert f"| 1 client, {named}: p50 ms |" in header, header
