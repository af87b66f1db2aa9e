"""Where dropped .onnx files are compiled to: a folder this process can write, or why none is.

`compile_cache_dir` set in the config is used as given (the operator's choice: anywhere). Unset,
it is <models_dir>/.cache, and when that cannot be written (a read-only models folder, e.g. a
mounted volume) or leads outside the models folder (a link: whoever can put one there must not
have the server write, or read as its own compiles, files elsewhere) a folder under the user's
cache directory ($XDG_CACHE_HOME or ~/.cache, unless the home is no folder: homeless) named after
the models folder, so two repositories never share entries. Blocking (touches the disk): call it
off the loop.
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
    return Path(environ.get("XDG_CACHE_HOME") or _home(environ) / ".cache")


def _home(environ) -> Path:
    return Path(environ["HOME"]) if environ.get("HOME") else Path.home()  # (else the password database's)


def homeless(environ=os.environ) -> str | None:
    """Why ~/.cache is no user cache folder (None: it may be): without $XDG_CACHE_HOME, a home
    that is not a folder. It is not made: the CPU image's user has /nonexistent for its home, and
    a server run there as root made /nonexistent/.cache (a tester, t84)."""
    if environ.get("XDG_CACHE_HOME"):
        return None
    try:
        home = _home(environ)
    except RuntimeError:  # (pathlib, 3.12 on: no HOME and no entry in the password database)
        return "there is no home folder (HOME is not set)"
    if home.is_dir():
        return None
    return f"the home folder {home} (HOME) {'is not a folder' if home.exists() else 'does not exist'}"


def user_cache_folder(models_dir: str, environ=os.environ) -> Path:
    models = os.path.abspath(models_dir)
    tag = hashlib.sha256(models.encode()).hexdigest()[:12]
    return user_cache_root(environ) / "aclserve" / "compile" / f"{os.path.basename(models) or 'models'}-{tag}"


def local_folder(models_dir: str) -> tuple[Path, str | None]:
    """<models_dir>/.cache, named as the scan names the sources (resolved: a relative --models
    too), and why it is not to be used when it leads outside the models folder (a symbolic link,
    itself or on its way: the models folder is the limit of what the server opens), else None."""
    root = Path(models_dir).resolve()
    local = root / ".cache"
    try:
        real = local.resolve(strict=False)
    except (OSError, RuntimeError):  # (3.11 words a loop as a RuntimeError)
        return local, "is a symbolic link loop"
    if real == local or root in real.parents:
        return local, None
    return local, f"leads outside the models folder (to {real})"


def resolve(configured: str, models_dir: str, environ=os.environ) -> Path:
    """The folder to compile into; raises CacheUnavailable with a plain reason."""
    if configured:  # (the operator's choice: anywhere, through links too)
        folder = Path(configured)
        problem = unwritable(folder)
        if problem:
            raise CacheUnavailable(f"cannot write the compile cache folder {folder} (compile_cache_dir): {problem}")
        return folder
    local, outside = local_folder(models_dir)
    local_problem = None if outside else unwritable(local)
    if outside is None and local_problem is None:
        return local
    why = outside or f"is not writable ({local_problem})"
    no_home = homeless(environ)
    if no_home:
        not_used = f"{why}, so it is not used" if outside else why
        raise CacheUnavailable(f"cannot compile .onnx models: {local} {not_used}, and there is no user cache folder to "
                               f"compile into instead: {no_home} (it is not made); set compile_cache_dir to a writable "
                               "folder, or XDG_CACHE_HOME")
    fallback = user_cache_folder(models_dir, environ)
    problem = unwritable(fallback)
    if problem:
        # the fallback named from the user cache folder on: a client reads this with paths
        # redacted (server/redact.py), which left the folder's last name alone, saying not where
        root = user_cache_root(environ)
        there = f"{fallback.relative_to(root)} in the user cache folder {root}"
        both = f"{why}, so it is not used, and {there} is not writable" if outside else f"{why} and neither is {there}"
        raise CacheUnavailable(f"cannot compile .onnx models: {local} {both} ($XDG_CACHE_HOME, else ~/.cache: "
                               f"{problem}); set compile_cache_dir to a writable folder")
    if str(fallback) not in _warned:
        _warned.add(str(fallback))
        log.warning("%s %s: compiling .onnx models into %s", local, f"{why}, not used" if outside else why, fallback)
    return fallback
