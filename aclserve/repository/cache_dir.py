"""Where dropped .onnx files are compiled to: a folder this process can write, or why none is.

`compile_cache_dir` set in the config is used as given. Unset, it is <models_dir>/.cache, and
when that cannot be written (a read-only models folder, e.g. a mounted volume) a folder under
the user's cache directory ($XDG_CACHE_HOME or ~/.cache) named after the models folder, so
two repositories never share entries. Blocking (touches the disk): call it off the loop.
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

_warned: set[str] = set()


class CacheUnavailable(RuntimeError):
    """No compile cache folder can be written; the message says which and why."""


def unwritable(folder: Path) -> str | None:
    """Why files cannot be created in `folder` (created if missing), or None when they can."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-"):
            pass
    except OSError as e:
        return e.strerror or str(e)
    return None


def user_cache_root(environ=os.environ) -> Path:
    """The user's cache directory: $XDG_CACHE_HOME, else ~/.cache."""
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def user_cache_folder(models_dir: str, environ=os.environ) -> Path:
    models = os.path.abspath(models_dir)
    tag = hashlib.sha256(models.encode()).hexdigest()[:12]
    return user_cache_root(environ) / "aclserve" / "compile" / f"{os.path.basename(models) or 'models'}-{tag}"


def resolve(configured: str, models_dir: str, environ=os.environ) -> Path:
    """The folder to compile into; raises CacheUnavailable with a plain reason."""
    if configured:
        folder = Path(configured)
        problem = unwritable(folder)
        if problem:
            raise CacheUnavailable(f"cannot write the compile cache folder {folder} (compile_cache_dir): {problem}")
        return folder
    local = Path(models_dir).resolve() / ".cache"  # as the scan names the sources (a relative --models too)
    local_problem = unwritable(local)
    if local_problem is None:
        return local
    fallback = user_cache_folder(models_dir, environ)
    problem = unwritable(fallback)
    if problem:
        # the fallback named from the user cache folder on: a client reads this with paths
        # redacted (server/redact.py), which left the folder's last name alone, saying not where
        root = user_cache_root(environ)
        raise CacheUnavailable(f"cannot compile .onnx models: {local} is not writable ({local_problem}) and neither "
                               f"is {fallback.relative_to(root)} in the user cache folder {root} ($XDG_CACHE_HOME, "
                               f"else ~/.cache: {problem}); set compile_cache_dir to a writable folder")
    if str(fallback) not in _warned:
        _warned.add(str(fallback))
        log.warning("%s is not writable (%s): compiling .onnx models into %s", local, local_problem, fallback)
    return fallback
