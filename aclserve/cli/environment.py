"""The ACLSERVE_* environment variables aclserve reads, gathered from where each is read, and the
warning about one set that none reads, given by every command that reads them: a misspelt name (the
token's, an E short) was silently ignored, the server started without the token it was given (a
tester). A warning, not a refusal: other tools may share the prefix."""
from __future__ import annotations

import difflib
import logging
import os
from typing import Mapping

from ..acl import DEVICE_ENV
from ..acl.cpu_environment import CPU_RUNTIME_ENV
from ..om.compile_child import HOLD_ENV
from ..secret_env import TOKEN_ENV
from .output import print_err

PREFIX = "ACLSERVE_"
# read by the container images aclserve ships, not by the server: deploy/ascend-entrypoint.sh
# (the Ascend root, the virtual environment) and the images' HEALTHCHECK (its port)
DEPLOY_ENV = ("ACLSERVE_ASCEND_ROOT", "ACLSERVE_VENV", "ACLSERVE_HEALTH_PORT")
# the peers benchmark harness's (README "Performance": the checkout it installs), which its servers inherit
TOOLS_ENV = ("ACLSERVE_SRC",)
KNOWN = frozenset((TOKEN_ENV, DEVICE_ENV, HOLD_ENV, *CPU_RUNTIME_ENV, *DEPLOY_ENV, *TOOLS_ENV))
# the test suite's own (tests/private_network.py): set in every server a test starts, never read by one
TEST_SUITE_PREFIX = "ACLSERVE_TESTS_"


def unknown_names(environ: Mapping[str, str]) -> list[str]:
    """The ACLSERVE_* names set in `environ` that aclserve does not read, sorted."""
    return sorted(name for name in environ
                  if name.startswith(PREFIX) and name not in KNOWN and not name.startswith(TEST_SUITE_PREFIX))


def unknown_line(environ: Mapping[str, str] = os.environ) -> str | None:
    """A line naming each ACLSERVE_* variable set that aclserve does not read, with the closest
    known name where one is close, and the known ones (never a value: it may be a token); None
    when there is none."""
    unknown = unknown_names(environ)
    if not unknown:
        return None
    said = []
    for name in unknown:
        # (the names after the prefix they all share, which alone made "PORT" close to "SRC")
        close = difflib.get_close_matches(name[len(PREFIX):], [known[len(PREFIX):] for known in KNOWN], n=1,
                                          cutoff=0.7)
        said.append(f"{name} (did you mean {PREFIX}{close[0]}?)" if close else name)
    return (f"{', '.join(said)}: not read by aclserve, ignored (known: {', '.join(sorted(KNOWN))}; "
            f"{TEST_SUITE_PREFIX}* are the test suite's)")


def warn_unknown(environ: Mapping[str, str] = os.environ) -> str | None:
    """`serve`'s: unknown_line as one WARNING log line; the line, or None when there is none."""
    line = unknown_line(environ)
    if line is not None:
        logging.getLogger(__name__).warning("%s", line)
    return line


def say_unknown(command: str, environ: Mapping[str, str] = os.environ) -> None:
    """The other commands that read ACLSERVE_* variables (`infer` and `profile --url` the token,
    `profile` in process the device's and the CPU runtime's, `compile` its child's): unknown_line
    on stderr as their warnings are written, once, before the command runs (`serve` alone said it,
    so a misspelt token's name went unnoticed where a 401 followed: a tester, t84)."""
    line = unknown_line(environ)
    if line is not None:
        print_err(f"aclserve {command}: warning: {line}")
