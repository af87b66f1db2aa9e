"""tools/bench_batching.py runs a fresh batcher per window on one pool, which takes one listener at
a time: each window's batcher lets the pool go when it is done, so the next window can start
(the second window failed with "the pool has its listener already")."""
from __future__ import annotations

import asyncio
import os
import sys

from aclserve.runtime import open_pool
from aclserve.scheduling import BatchingConfig

from tests import REPO
from tests.tiny_models import affine_onnx, affine_request, compile_cpu_om

sys.path.insert(0, os.path.join(REPO, "tools"))

import bench_batching  # noqa: E402


def test_windows_one_after_another_share_the_pool(runtime, tmp_path):
    om = compile_cpu_om(affine_onnx(tmp_path / "affine.onnx"), tmp_path / "affine.om", "1,2,4")
    pool = open_pool(runtime, om, "affine", slots=2)
    sample = affine_request(1)

    async def windows():
        on, off = BatchingConfig(enabled=True), BatchingConfig(enabled=False)
        closed = [await bench_batching.closed_loop(pool, sample, config, 4, 0.05, 0.2) for config in (on, off)]
        opened = await bench_batching.open_loop(pool, sample, on, 200.0, 0.2, 0.1, None, 30.0, 0)
        return closed, opened

    try:
        closed, opened = asyncio.run(windows())
    finally:
        pool.close()
    assert [window["errors"] for window in closed] == [0, 0]
    assert all(window["done"] > 0 for window in closed)
    assert opened["completed"] > 0


def test_help_lists_the_modes_and_the_labels_are_the_readmes():
    """`bench_batching.py --help` did not mention the `priority` mode README runs, and that mode
    printed its configurations as default / jit / eager where README's table names them by what
    they set (an independent tester, t56): --help lists both modes, and each row of README's
    table is named by the label the tool prints."""
    import re
    import subprocess

    import bench_priority

    shown = subprocess.run([sys.executable, os.path.join(REPO, "tools", "bench_batching.py"), "--help"],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "bench_batching.py priority [options]" in shown.stdout, shown.stdout
    assert " / ".join(bench_priority.MODES) in " ".join(shown.stdout.split()), shown.stdout
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        section = f.read().split("**Priority under saturation**", 1)[1]
    table = section[section.index("\n| config |"):].split("\n\n", 1)[0]
    named = [re.match(r"\| `([^`]+)`", row).group(1) for row in table.splitlines()[3:]]
    assert named == list(bench_priority.MODES), named
