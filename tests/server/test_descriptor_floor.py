"""`aclserve serve` under a descriptor limit too low to run it (`ulimit -n`, hard limit too, so
that it cannot be raised) exits at once with one line naming the limit, the least it needs and
`ulimit -n`, before it loads anything. Before, it failed wherever its descriptors ran out: grpc
core aborted at 16 (SIGABRT), "[Errno 24] Too many open files" at 20, the models folder "cannot
be read" at 24, a model "not a loadable OM file" at 26. Real processes, the limit set in the
child (preexec_fn)."""
from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from aclserve.server.descriptors import MIN_DESCRIPTORS
from tests import REPO
from tests.processes import leashed_popen
from tests.serving import free_port

HANG_GUARD_S = 60


def serve_under(limit: tuple[int, int], models) -> subprocess.Popen:
    """`python -m aclserve serve` of `models`, gRPC on, RLIMIT_NOFILE `limit` (soft, hard)."""
    return leashed_popen([sys.executable, "-m", "aclserve", "serve", "--models", str(models), "--port", "0",
                          "--grpc-port", str(free_port()), "--device", "cpu"],
                         cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, limit))


@pytest.mark.parametrize("limit", [16, MIN_DESCRIPTORS - 1])
def test_a_descriptor_limit_below_the_minimum_is_one_line_and_exit_2(models_dir, limit):
    proc = serve_under((limit, limit), models_dir)
    try:
        out, err = proc.communicate(timeout=HANG_GUARD_S)  # (before: at 63 it served, and this ended it)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 2, err
    assert err.splitlines() == [f"aclserve serve: error: the descriptor limit is {limit} (ulimit -n, its hard limit "
                                f"too), below the {MIN_DESCRIPTORS} that aclserve serve needs at least: raise it "
                                "(ulimit -n 8960 fits max_connections; docker run --ulimit nofile=N, systemd "
                                "LimitNOFILE=N)"], err
    assert out == ""
