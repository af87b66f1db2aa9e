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
# the device plugin mounts at <root>/driver, go on LD_LIBRARY_PATH as Ascend's container guides
# put them. The server runs as `python -m aclserve` of $ACLSERVE_VENV (/opt/aclserve), the
# environment the image installed it in: no console script on PATH is needed, and CANN's own
# Python tools (ATC's, through the python3 on PATH) keep their packages.

root="${ACLSERVE_ASCEND_ROOT:-/usr/local/Ascend}"
if [ -n "${ASCEND_SET_ENV:-}" ]; then
    tried=("$ASCEND_SET_ENV")
else
    tried=("$root/ascend-toolkit/set_env.sh" "$root/cann/set_env.sh")
fi
set_env=""
for candidate in "${tried[@]}"; do
    if [ -f "$candidate" ]; then
        set_env="$candidate"
        break
    fi
done
if [ -z "$set_env" ]; then
    printf -v listed '%s, ' "${tried[@]}"
    echo "aclserve: no CANN set_env.sh found (tried ${listed%, }): build FROM a CANN image," \
         "or set ASCEND_SET_ENV to its set_env.sh" >&2
    exit 1
fi
args=("$@")
set --  # a sourced script sees the caller's arguments: the server's are not for it
# shellcheck disable=SC1090
source "$set_env"
export LD_LIBRARY_PATH="$root/driver/lib64/common:$root/driver/lib64/driver${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "${ACLSERVE_VENV:-/opt/aclserve}/bin/python" -m aclserve serve "${args[@]}"
