"""The environment variables that hold a secret, and an environment without them for the child
processes aclserve starts (om/own_python.py: a compile's child, and the leash that runs ATC, a
vendor binary, under it), which have no use for them: what a child is given may end up in its
crash dumps, logs or /proc/<pid>/environ, readable by whoever runs as the same user."""
from __future__ import annotations

import os
from typing import Mapping

TOKEN_ENV = "ACLSERVE_API_TOKEN"  # the API token, used instead of api_token (server/auth.py; client commands send it)
SECRET_ENV = (TOKEN_ENV,)  # (the config's only secret is api_token: config/server.py)


def without_secrets(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """A copy of `environ` for a child process, without the SECRET_ENV variables."""
    return {name: value for name, value in environ.items() if name not in SECRET_ENV}
