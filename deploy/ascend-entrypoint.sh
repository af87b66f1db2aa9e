#!/bin/bash
# The Ascend image's entrypoint (deploy/Dockerfile.ascend, under tini): CANN's environment, the
# driver's libraries, then `python -m aclserve serve ARGS` from aclserve's own environment.
#
# CANN's set_env.sh (pyACL's `acl` module on PYTHONPATH, its libraries on LD_LIBRARY_PATH, atc on
# PATH): $ASCEND_SET_ENV when set, else the first found of ascend-toolkit/set_env.sh (the
# toolkit's layout until CANN 8.x) and cann/set_env.sh (newer CANN 8.x) under
# $ACLSERVE_ASCEND_ROOT (/usr/local/Ascend). None found: one line naming the paths tried, and
# exit 1, rather than a container restarting on an error that names none. Its exit status is
# not judged: a script whose last line tests for something optional ends non-zero.
# The driver's libraries (libascend_hal.so and the like), which the Ascend docker runtime or
# the device plugin mounts at <root>/driver, go on LD_LIBRARY_PATH before set_env.sh's:
# lib64/common and lib64/driver, as Ascend's CANN container images set them, then lib64 itself,
# the folder Ascend's guide to containers mounts from the host, which its ATC instructions put
# on the path too (a folder that is not there costs nothing). The server runs as
# `python -m aclserve` of $ACLSERVE_VENV (/opt/aclserve), the environment the image installed it
# in: no console script on PATH is needed, and CANN's own Python tools (ATC's, through the python3
# on PATH) keep their packages.
# set_env.sh runs in this shell (its exports are the point), so what the server is started with
# is settled before it runs, in names of this script's own (_aclserve_*): a vendor script that
# sets root, args or the like does not change the server's arguments or library path.

_aclserve_root="${ACLSERVE_ASCEND_ROOT:-/usr/local/Ascend}"
if [ -n "${ASCEND_SET_ENV:-}" ]; then
    _aclserve_tried=("$ASCEND_SET_ENV")
else
    _aclserve_tried=("$_aclserve_root/ascend-toolkit/set_env.sh" "$_aclserve_root/cann/set_env.sh")
fi
_aclserve_set_env=""
for _aclserve_candidate in "${_aclserve_tried[@]}"; do
    if [ -f "$_aclserve_candidate" ]; then
        _aclserve_set_env="$_aclserve_candidate"
        break
    fi
done
if [ -z "$_aclserve_set_env" ]; then
    printf -v _aclserve_listed '%s, ' "${_aclserve_tried[@]}"
    echo "aclserve: no CANN set_env.sh found (tried ${_aclserve_listed%, }):" \
         "build FROM a CANN image, or set ASCEND_SET_ENV to its set_env.sh" >&2
    exit 1
fi
_aclserve_driver="$_aclserve_root/driver/lib64"
_aclserve_driver_libs="$_aclserve_driver/common:$_aclserve_driver/driver:$_aclserve_driver"
_aclserve_python="${ACLSERVE_VENV:-/opt/aclserve}/bin/python"
_aclserve_args=("$@")
set --  # a sourced script sees the caller's arguments: the server's are not for it
# shellcheck disable=SC1090
source "$_aclserve_set_env"
export LD_LIBRARY_PATH="$_aclserve_driver_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$_aclserve_python" -m aclserve serve "${_aclserve_args[@]}"
