"""Names in the models folder: which ones the scan skips (hidden, temporary: being written, and
fsck's lost+found), which make a valid model name, and how a name that is not UTF-8 is shown."""
from __future__ import annotations

import re

TEMP_SUFFIXES = (".tmp", ".part")
# the folder fsck keeps at an ext2/3/4 file system's root: a volume mounted as the models folder
# (KServe's pvc:// on ext4) has one, which as a model of a bad name kept strict readiness 503
FILE_SYSTEM_NAMES = ("lost+found",)
MAX_NAME = 128  # characters of a model's name
# (fullmatch: `$` also matches before a final line feed, and "digits\n" passed for a name)
_NAME_RE = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.\-]{{0,{MAX_NAME - 1}}}")


def escape_undecodable(text: str) -> str:
    """A file name (or a text with one) as it can be shown, logged and encoded: bytes that are
    not UTF-8 (os.listdir hands them over as surrogates) written as \\xNN."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def is_ignored_name(name: str) -> bool:
    return name.startswith(".") or name.endswith(TEMP_SUFFIXES) or name in FILE_SYSTEM_NAMES


def check_model_name(name: str) -> str | None:
    """None when `name` is a valid model name, else the reason."""
    if not name or name in (".", ".."):
        return "model names may not be empty, '.' or '..'"
    if "/" in name or "\\" in name:
        return "model names may not contain path separators ('/', '\\')"
    if "\0" in name:  # (no separator: said as such, not as one)
        return "model names may not contain a NUL character (\\x00)"
    if ".." in name:
        return "model names may not contain '..'"
    if name.startswith("."):
        return "model names may not start with '.'"
    if not _NAME_RE.fullmatch(name):
        return "model names use ASCII letters, digits, '_', '-', '.' (at most 128, not starting with '-' or '.')"
    return None


def too_long(name: str) -> str | None:
    """A name longer than any model's (check_model_name), as every answer says it: by its
    length, not quoted (a client's MiB sent back); None for a name that is not."""
    return f"a name of {len(name):,} characters (at most {MAX_NAME})" if len(name) > MAX_NAME else None
