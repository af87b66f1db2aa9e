"""The models folder as the server starts: a folder, or one line saying what it is instead."""
from __future__ import annotations

from pathlib import Path


class RepositoryError(RuntimeError):
    """The repository cannot start (e.g. the models folder is missing)."""


def check_models_folder(root: Path) -> None:
    """RepositoryError unless `root` is a folder (`aclserve serve` asks before it listens)."""
    try:
        exists, folder = root.exists(), root.is_dir()
    except OSError as e:  # (a folder on the way that cannot be searched: EACCES)
        raise RepositoryError(f"models folder {root} cannot be reached ({e.strerror or e})") from None
    if exists and not folder:
        raise RepositoryError(f"models folder {root} is a file, not a folder (pass --models DIR)")
    if not folder:
        raise RepositoryError(f"models folder {root} does not exist (run from the folder that holds "
                              "models/, or pass --models DIR)")
