"""The version a request names, read as the models folder names versions (layout.py: folders
named by positive whole numbers), before any lookup."""
from __future__ import annotations

from ..config import MAX_VERSION_DIGITS  # versions are folder names of positive integers; longer is not one
from ..errors import InvalidInput


def asked_version(version) -> str | None:
    """`version` as the folder names it ("07" is "7"), or None when the request names none;
    InvalidInput when it cannot be a version (as Triton: not a 404)."""
    if version in (None, ""):
        return None
    version = str(version)
    if len(version) > MAX_VERSION_DIGITS:
        raise InvalidInput(f"version must be a positive integer of at most {MAX_VERSION_DIGITS} digits")
    if not (version.isascii() and version.isdigit()) or int(version) == 0:
        raise InvalidInput(f"version must be a positive integer, got {version!r}")
    return str(int(version))
