"""Keep this machine's filesystem layout out of what clients read.

Messages that reach a client (errors, repository index reasons, metric labels) may quote a
path from the repository, the compile cache or a library. An absolute path is shown relative
to the models folder when it is inside it, else by its last component, when it has two or more
components; request paths (/v2/..., /metrics) and one-component paths are left alone.

The rule reads the text only, never the disk: a message may also quote a client's own value
(an input named /etc/shadow), and a rewrite that depended on whether the path exists here
would tell the client that it does. Such a value is misquoted (`unknown input 'shadow'`) the
same way whether or not it exists.
"""
from __future__ import annotations

import os
import re

_ABSOLUTE = re.compile(r"(?<![\w.:/~-])/(?:[^\s'\"`,;:()\[\]{}<>/]+/)*[^\s'\"`,;:()\[\]{}<>/]*")
_ROUTES = ("v2", "metrics")  # the first components of the server's own routes
# Characters of a message read (and shown): a longer one is cut there first. Messages quote
# clients' values (an input's or a model's name), and each path-like run costs a call of
# _replace in Python: a 15 MB input name of "/ " repeated held the event loop 4 s (2 s over gRPC,
# whose status message cannot pass 16 KB of metadata anyway): 8,192 cost about 5 ms at worst.
MAX_TEXT = 8192


class PathRedactor:
    def __init__(self, models_dir: str):
        self.root = os.path.abspath(models_dir)

    def __call__(self, text: str) -> str:
        if len(text) > MAX_TEXT:
            text = f"{text[:MAX_TEXT]}... ({len(text) - MAX_TEXT:,} more characters)"
        if "/" not in text:
            return text
        return _ABSOLUTE.sub(self._replace, text)

    def _replace(self, match: re.Match) -> str:
        path = match.group(0).rstrip(".")
        tail = match.group(0)[len(path):]
        if path == self.root or path.startswith(self.root + os.sep):
            rel = os.path.relpath(path, self.root)
            return ("<models>" if rel == "." else f"<models>/{rel}") + tail
        first, sep, rest = path[1:].partition("/")
        if not sep or not rest.strip("/") or first in _ROUTES:
            return match.group(0)
        return os.path.basename(path.rstrip("/")) + tail
