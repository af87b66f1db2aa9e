"""Keep this machine's filesystem layout out of what clients read.

Messages that reach a client (errors, repository index reasons, metric labels) may quote a
path from the repository, the compile cache or a library. Every absolute path that exists on
this machine (or whose folder does) is shown relative to the models folder when it is inside
it, else by its last component. Request paths such as /v2/models/x (no folder /v2 here) are
left alone.
"""
from __future__ import annotations

import os
import re

_ABSOLUTE = re.compile(r"(?<![\w.:/~-])/(?:[^\s'\"`,;:()\[\]{}<>/]+/)*[^\s'\"`,;:()\[\]{}<>/]*")


class PathRedactor:
    def __init__(self, models_dir: str):
        self.root = os.path.abspath(models_dir)

    def __call__(self, text: str) -> str:
        if "/" not in text:
            return text
        return _ABSOLUTE.sub(self._replace, text)

    def _replace(self, match: re.Match) -> str:
        path = match.group(0).rstrip(".")
        tail = match.group(0)[len(path):]
        if len(path) < 2 or not _on_disk(path):
            return match.group(0)
        if path == self.root or path.startswith(self.root + os.sep):
            rel = os.path.relpath(path, self.root)
            return ("<models>" if rel == "." else f"<models>/{rel}") + tail
        return (os.path.basename(path.rstrip("/")) or "<path>") + tail


def _on_disk(path: str) -> bool:
    """A path of this machine: it exists, or it has 2+ components and the first is a folder."""
    first, sep, _ = path[1:].partition("/")
    return os.path.lexists(path) or (bool(sep) and os.path.isdir("/" + first))
