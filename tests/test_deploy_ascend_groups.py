"""deploy/Dockerfile.ascend's user and group lines, run for real (no Docker here): in a mount
namespace of their own (`unshare -m`, its mounts seen by nothing outside it) over a copy of this
machine's /etc, given a group file as a CANN base image may have it. The server's user must join
a HwHiAiUser group of the host's group id, whatever the image's group file holds."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests import REPO
from tests.processes import run_as_group
from tests.test_deploy import dockerfile

# the lines to run in that namespace: /etc and /home are copies (useradd --create-home writes there)
RUN = """set -e
mount --bind "$1/etc" /etc
mount --bind "$1/home" /home
bash -c "$2"
getent group HwHiAiUser
id -G aclserve
"""


def group_lines() -> str:
    """The RUN's part that makes the user and the HwHiAiUser group, as the image runs it."""
    install = next(run for run in dockerfile(REPO / "deploy" / "Dockerfile.ascend")["RUN"] if "useradd" in run)
    found = re.search(r"\(id -u aclserve .*?usermod -aG HwHiAiUser aclserve", install)
    assert found, install
    return found.group(0)


def run_over(tmp_path, group_file_lines: list[str], gid: int) -> subprocess.CompletedProcess:
    root = tmp_path / "root"
    (root / "home").mkdir(parents=True)
    shutil.copytree("/etc", root / "etc", symlinks=True)
    for name, line in (("group", "{}:x:{}:\n"), ("gshadow", "{}:!::\n")):
        path = root / "etc" / name
        if path.exists():
            with path.open("a") as f:
                f.writelines(line.format(*entry.split(":")) for entry in group_file_lines)
    return run_as_group(["unshare", "-m", "--propagation", "private", "bash", "-c", RUN, "bash", str(root),
                         group_lines()], timeout=60, env=dict(os.environ, HWHIAI_GID=str(gid)))


def namespaces_here(tmp_path) -> bool:
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("unshare", "groupadd", "groupmod", "useradd")):
        return False
    probe = run_as_group(["unshare", "-m", "--propagation", "private", "mount", "--bind", str(tmp_path),
                          str(tmp_path)], timeout=60)
    return probe.returncode == 0


@pytest.mark.parametrize("image_groups", [[], ["HwHiAiUser:1001"], ["HwHiAiUser:1000"]])
def test_the_host_group_id_is_taken_whoever_holds_it_in_the_image(tmp_path, image_groups):
    """Ubuntu 24.04 (a CANN base image's) has group ubuntu of id 1000, a common HwHiAiUser id on
    hosts: groupadd --gid 1000 and groupmod --gid 1000 failed (status 4, "GID '1000' already
    exists") and the build with them. Now the id may be another group's too (--non-unique): the
    device files' group is a number."""
    if not namespaces_here(tmp_path):
        pytest.skip("needs root, unshare -m and the shadow tools (groupadd, groupmod, useradd)")
    done = run_over(tmp_path, ["ubuntu:1000", *image_groups], 1000)
    assert done.returncode == 0, done.stderr
    group, ids = done.stdout.splitlines()[-2:]
    assert group.split(":")[2:] == ["1000", "aclserve"], group
    assert "1000" in ids.split(), ids
