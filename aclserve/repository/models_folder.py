"""The models folder as the server starts: a folder it can read, or one line saying what it is
instead; how it is listed, at the start and by every scan (layout.py); and whether a path in it
resolves inside it, or why not (layout.py's files and folders, unread.py's version folders)."""
from __future__ import annotations

import errno
from pathlib import Path


# why a path leading out of the folder is refused; the usual cause, a symbolic link out of it, is what
# KServe's storage initializer makes of a pvc:// model without its direct PVC mount (README)
OUTSIDE = ("resolves outside the repository (links out of the models folder are not followed: "
           "it must hold the files themselves)")


class RepositoryError(RuntimeError):
    """The repository cannot start (e.g. the models folder is missing)."""


def folder_entries(root: Path) -> list[Path]:
    """The entries of the folder `root`, sorted. OSError when it cannot be listed (no read
    permission: `chmod 000`) or what it lists cannot be looked at (no search permission:
    `chmod 644`, where every scan failed on the first entry it looked at)."""
    entries = sorted(root.iterdir())
    if entries:
        try:
            entries[0].lstat()  # (the folder's search permission alone decides it, not the entry's)
        except FileNotFoundError:  # removed since it was listed
            pass
    return entries


def resolved_inside(root: Path, path: Path) -> Path | None:
    """The resolved path when it stays inside `root` (itself resolved), else None (a link out of it,
    to nothing, or in a loop)."""
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    return real if real == root or root in real.parents else None


def not_inside(path: Path) -> str:
    """Why `path` is not a file inside the repository (`resolved_inside` said None)."""
    try:
        path.resolve(strict=True)
    except RuntimeError:  # Python 3.11-3.12 words a loop so
        return "is a symbolic link loop"
    except FileNotFoundError:
        return "is a link to nothing"
    except OSError as e:
        return "is a symbolic link loop" if e.errno == errno.ELOOP else f"cannot be resolved ({e.strerror or e})"
    return OUTSIDE


def check_models_folder(root: Path) -> None:
    """RepositoryError unless `root` is a folder that can be read (`aclserve serve` asks before
    it listens, the repository as it starts): one that cannot was served as an empty folder,
    the server never ready, its reason in a WARNING line and the repository index alone."""
    try:
        exists, folder = root.exists(), root.is_dir()
    except OSError as e:  # (a folder on the way that cannot be searched: EACCES)
        raise RepositoryError(f"models folder {root} cannot be reached ({e.strerror or e})") from None
    if exists and not folder:
        raise RepositoryError(f"models folder {root} is a file, not a folder (pass --models DIR)")
    if not folder:
        raise RepositoryError(f"models folder {root} does not exist (run from the folder that holds "
                              "models/, or pass --models DIR)")
    try:
        folder_entries(root)
    except OSError as e:
        raise RepositoryError(f"models folder {root} cannot be read ({e.strerror or e}): the user aclserve runs "
                              "as needs read and search permission on it (r-x)") from None
