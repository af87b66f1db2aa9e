"""trace/cpu_quota.py: the cgroup CPU quota `aclserve profile` counts the server's cores by, read
from files laid out as Linux lays them (v2 and v1), and a real one where cgroups can be made here."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from aclserve.trace import analysis, chrome, cpu_quota
from aclserve.trace.host_cpu import HostCpu
from tests import REPO
from tests.trace.test_analysis import _queued_behind_a_slow_device


def _proc(tmp_path: Path, cgroup: str, mounts: list[tuple[str, str, str, str]]) -> str:
    """A /proc/self of `cgroup`'s lines and mountinfo lines of (mounted root, mount point, fs type,
    super options)."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text("".join(
        f"{30 + i} 23 0:{40 + i} {root} {point} rw,relatime - {fs} {fs} {options}\n"
        for i, (root, point, fs, options) in enumerate(mounts)))
    return str(proc)


def _write(folder: Path, **files: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text)


def test_v2_the_tightest_cpu_max_from_the_process_cgroup_up_to_the_root(tmp_path):
    """A Kubernetes pod's limit sits on the pod's cgroup, its container's own saying max."""
    root = tmp_path / "cgroup"
    _write(root / "kubepods", cpu_max="max 100000\n")
    _write(root / "kubepods" / "pod1", cpu_max="150000 100000\n", cpu_stat="nr_throttled 3\nthrottled_usec 250000\n")
    _write(root / "kubepods" / "pod1" / "ctr", cpu_max="max 100000\n", cpu_stat="throttled_usec 0\n")
    proc = _proc(tmp_path, "0::/kubepods/pod1/ctr\n", [("/", str(root), "cgroup2", "rw")])
    quota = cpu_quota.read(proc)
    assert quota.cores == 1.5 and cpu_quota.throttled_s(quota) == 0.25
    _write(root / "kubepods" / "pod1" / "ctr", cpu_max="30000 100000\n", cpu_stat="throttled_usec 100000\n")
    quota = cpu_quota.read(proc)  # (both throttle it, each when its own runs out)
    assert quota.cores == 0.3 and cpu_quota.throttled_s(quota) == pytest.approx(0.35)


def test_v1_cfs_quota_of_a_container_whose_own_cgroup_is_mounted_as_the_root(tmp_path):
    """Docker on cgroup v1 without a cgroup namespace: /proc/self/cgroup names the host's path,
    /docker/ID, which is the root of the hierarchy mounted in the container."""
    mount = tmp_path / "cpu,cpuacct"
    _write(mount, cpu_cfs_quota_us="200000\n", cpu_cfs_period_us="100000\n",
           cpu_stat="nr_periods 9\nnr_throttled 4\nthrottled_time 40000000\n")
    proc = _proc(tmp_path, "11:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n", [
        ("/docker/abc", str(mount), "cgroup", "rw,cpu,cpuacct"),
        ("/docker/abc", str(tmp_path / "memory"), "cgroup", "rw,memory"),
        ("/", str(tmp_path / "unified"), "cgroup2", "rw")])  # (hybrid: no cpu controller there)
    quota = cpu_quota.read(proc)
    assert quota.cores == 2.0 and cpu_quota.throttled_s(quota) == 0.04


def test_no_quota_set_nor_readable_is_none(tmp_path):
    root = tmp_path / "cgroup"
    _write(root / "a", cpu_max="max 100000\n")
    _write(tmp_path / "cpu", cpu_cfs_quota_us="-1\n", cpu_cfs_period_us="100000\n")
    proc = _proc(tmp_path, "1:cpu:/\n0::/a\n", [("/", str(root), "cgroup2", "rw"),
                                                   ("/", str(tmp_path / "cpu"), "cgroup", "rw,cpu")])
    assert cpu_quota.read(proc) is None
    assert cpu_quota.read(str(tmp_path / "no-proc")) is None and cpu_quota.throttled_s(None) is None


def _temporary_cgroup(name: str) -> tuple[Path, str]:
    """A cgroup of its own holding a 0.2-core quota (v2's cpu.max, else v1's cpu controller), and
    its file to join it; skipped where this process may not make one."""
    if os.geteuid() != 0:
        pytest.skip("making a cgroup needs root")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, fs = line.split(" - ")[0].split(), line.split(" - ")[1].split()
        point = Path(fields[4])
        v2 = fs[0] == "cgroup2" and "cpu" in (point / "cgroup.subtree_control").read_text().split()
        if v2 or (fs[0] == "cgroup" and "cpu" in fs[2].split(",")):
            folder = point / name
            try:
                folder.mkdir()
            except OSError as e:
                pytest.skip(f"cannot make a cgroup at {point}: {e}")
            if v2:
                (folder / "cpu.max").write_text("20000 100000")
            else:
                (folder / "cpu.cfs_period_us").write_text("100000")
                (folder / "cpu.cfs_quota_us").write_text("20000")
            return folder, str(folder / "cgroup.procs")
    pytest.skip("no cgroup hierarchy with the cpu controller here")


def test_a_server_under_a_cpu_quota_is_said_held_back_by_it_not_by_others(tmp_path):
    """A reviewer's run in a cgroup of 0.3 cores (cpu.max "30000 100000"), a thread spinning,
    read "host CPU taken by others: ... used 0.31 of its 2 cores: other processes held them": the
    quota throttled it, its threads waiting as if preempted, and the cores were counted from the
    affinity alone. Real figures, in a temporary cgroup of 0.2 cores."""
    folder, procs = _temporary_cgroup(f"aclserve-test-{os.getpid()}")
    script = tmp_path / "quota.py"
    script.write_text(textwrap.dedent("""
        import dataclasses, json, os, sys, threading, time
        from aclserve.trace.host_cpu import CpuMeter
        with open(sys.argv[1], "w") as f:
            f.write(str(os.getpid()))
        meter = CpuMeter()
        spun, done = threading.Event(), threading.Event()
        def spin():  # (a launcher packing: alive when the meter stops, as the server's threads are)
            end = time.thread_time() + 0.2
            while time.thread_time() < end:
                pass
            spun.set()
            done.wait()
        thread = threading.Thread(target=spin, name="m#0-launch")
        thread.start()
        spun.wait()
        cpu = meter.stop()
        done.set()
        thread.join()
        print(json.dumps(dataclasses.asdict(cpu)))
    """))
    try:
        out = subprocess.run([sys.executable, str(script), procs], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    finally:
        folder.rmdir()  # (its one process has ended)
    assert out.returncode == 0, out.stderr
    cpu = HostCpu(**json.loads(out.stdout))
    assert cpu.quota == cpu.cores == 0.2 and cpu.throttled_s > 0
    s = analysis.summarize(chrome.events(_queued_behind_a_slow_device()), cpu, compute_on_host=True)
    assert s.verdict.startswith("held back by its CPU quota: the server used "), s.verdict
    assert "of its cgroup's CPU quota of 0.2 cores, throttled " in s.verdict and "not other processes" in s.verdict
    assert "of 0.2 cores, its CPU quota;" in analysis.format_summary(s)
