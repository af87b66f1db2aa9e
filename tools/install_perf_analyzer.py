#!/usr/bin/env python3
"""Install Triton's perf_analyzer (its C++ load generator) into PREFIX, to measure aclserve
the way Triton users measure it.

PyPI's "perf-analyzer" package is a placeholder, and the tritonclient wheels from 2.55 on need
glibc 2.38 (Debian 12 has 2.36), so this takes the binary bundled in the tritonclient 2.50.0
manylinux wheel, with the two shared libraries it loads: libcudart 12 (from the
nvidia-cuda-runtime-cu12 wheel; loaded, never used: no GPU is needed for HTTP or gRPC) and
libb64 (Debian's libb64-0d package, unpacked, not installed). Needs pip's and apt's package
registries; nothing is installed system-wide.

    python tools/install_perf_analyzer.py [PREFIX]      # default out/perf-analyzer
    PREFIX/perf_analyzer -m digits -u 127.0.0.1:8000 -i http --concurrency-range 1:16:4

Result: PREFIX/perf_analyzer, a wrapper that points LD_LIBRARY_PATH at PREFIX/lib. Run again,
it leaves a working install as it is.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile

from bench_run import run_tool  # (tools/, beside this file)

TRITONCLIENT = "tritonclient==2.50.0"
BINARY = "tritonclient-2.50.0.data/data/bin/perf_analyzer"
CUDART = "nvidia-cuda-runtime-cu12"
CUDART_LIB = "libcudart.so.12"
LIBB64 = "libb64-0d"

WRAPPER = """#!/usr/bin/env bash
# perf_analyzer with the libraries install_perf_analyzer.py put beside it
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$here/perf_analyzer.bin" "$@"
"""


def works(wrapper: str) -> bool:
    try:
        return subprocess.run([wrapper, "--version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def pip_download(requirement: str, dest: str, *extra: str) -> str:
    """The wheel of `requirement` downloaded into `dest` (no dependencies)."""
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    *extra, "-d", dest, requirement], check=True)
    name = requirement.split("=")[0].replace("-", "_")
    wheels = glob.glob(os.path.join(dest, f"{name}-*.whl"))
    if not wheels:
        raise SystemExit(f"install_perf_analyzer: pip downloaded no wheel of {requirement}")
    return wheels[0]


def extract(wheel: str, suffix: str, target: str) -> None:
    """Copy the one member of `wheel` whose path ends with `suffix` to `target`."""
    with zipfile.ZipFile(wheel) as z:
        members = [m for m in z.namelist() if m.endswith(suffix)]
        if not members:
            raise SystemExit(f"install_perf_analyzer: no {suffix} in {os.path.basename(wheel)}")
        with z.open(members[0]) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)


def libb64(work: str, lib: str) -> None:
    """libb64's shared library from Debian's package, unpacked (apt-get download needs no root)."""
    download = ["apt-get", "download", LIBB64]
    if subprocess.run(download, cwd=work, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], check=True)  # no package lists yet
        subprocess.run(download, cwd=work, check=True, capture_output=True)
    deb = glob.glob(os.path.join(work, f"{LIBB64}_*.deb"))[0]
    unpacked = os.path.join(work, "deb")
    subprocess.run(["dpkg", "-x", deb, unpacked], check=True)
    for path in glob.glob(os.path.join(unpacked, "usr", "lib", "*", "libb64.so*")):
        shutil.copy(path, lib, follow_symlinks=True)


def install(prefix: str) -> str:
    wrapper = os.path.join(prefix, "perf_analyzer")
    if works(wrapper):
        print(f"{wrapper} is installed")
        return wrapper
    lib = os.path.join(prefix, "lib")
    os.makedirs(lib, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="perf-analyzer-") as work:
        client = pip_download(TRITONCLIENT, work, "--platform", "manylinux1_x86_64")
        binary = os.path.join(prefix, "perf_analyzer.bin")
        extract(client, BINARY, binary)
        os.chmod(binary, os.stat(binary).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        extract(pip_download(CUDART, work, "--platform", "manylinux2014_x86_64"), f"/{CUDART_LIB}",
                os.path.join(lib, CUDART_LIB))
        libb64(work, lib)
    with open(wrapper, "w") as f:
        f.write(WRAPPER)
    os.chmod(wrapper, 0o755)
    if not works(wrapper):
        raise SystemExit(f"install_perf_analyzer: {wrapper} --version failed (missing libraries? "
                         f"try: ldd {os.path.join(prefix, 'perf_analyzer.bin')})")
    print(f"installed: {wrapper}")
    return wrapper


def main(argv=None) -> int:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # (its arguments were read by hand: `--bogus` installed into ./--bogus, and further ones were ignored)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prefix", nargs="?", default=os.path.join(root, "out", "perf-analyzer"), metavar="PREFIX",
                    help="the folder to install into (default out/perf-analyzer/ of this checkout)")
    args = ap.parse_args(argv)
    # (a download or an unpacking that failed is one line, exit status 1; a Ctrl-C 130)
    return run_tool("install_perf_analyzer", lambda: installed(os.path.abspath(args.prefix)),
                    cleaned="its work folder removed")


def installed(prefix: str) -> int:
    install(prefix)
    return 0


if __name__ == "__main__":
    sys.exit(main())
