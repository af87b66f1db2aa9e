"""Keep this machine's filesystem layout out of what clients read.

Messages that reach a client (errors, repository index reasons, metric labels) may quote a
path from the repository, the compile cache or a library. An absolute path is shown relative
to the models folder when it is inside it (`<models>/a/1/model.om`), relative to another folder
the server knows when inside one (trace_dir, the compile cache's: `run1/x.json`; the operator's
trace file is known as itself), else by its last component, when it has two or more components; request
paths (/v2/..., /metrics) and one-component paths are left alone.

The folders the server knows are found as written, before any other rule: their paths may hold
what ends a path in prose (`/home/John Smith/models`, `/srv/my models:x`), which the generic
rule cannot read whole, and a folder's name was shown from its blank or colon on. A path after
a colon (`path:/opt/x/a.so`) is a path too.

The rule reads the text only, never the disk (the known folders' real paths are read once, when
the redactor is made): a message may also quote a client's own value
(an input named /etc/shadow), and a rewrite that depended on whether the path exists here
would tell the client that it does. Such a value is misquoted (`unknown input 'shadow'`) the
same way whether or not it exists.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from .client_text import cut

# what a path's component holds in prose: a blank, a quote, punctuation or a colon before a
# blank ends it ("cannot read /x/y: no such file")
_PART = r"(?:[^\s'\"`,;:()\[\]{}<>/]|:(?![\s:/]|$))"
_NOT_AFTER = r"(?<![\w.~/-])"  # a path starts a word: not the tail of "a/b", "./x" or "~/x"
_ABSOLUTE = rf"{_NOT_AFTER}/(?:{_PART}+/)*{_PART}*"
# where a known folder's path ends (not where a longer name goes on: /srv/models2, /srv/models:x)
_FOLDER_ENDS = r"(?=/|[\s'\"`,;()\[\]{}<>]|[:.]?(?:\s|$))"
_ROUTES = ("v2", "metrics")  # the first components of the server's own routes
# Characters of a message read (and shown): a longer one is cut there first. Messages quote
# clients' values (an input's or a model's name), and each path-like run costs a call of
# _replace in Python: a 15 MB input name of "/ " repeated held the event loop 4 s (2 s over gRPC,
# whose status message cannot pass 16 KB of metadata anyway): 8,192 cost about 5 ms at worst.
MAX_TEXT = 8192


class PathRedactor:
    def __init__(self, models_dir: str, *known: str):
        """`known`: other folders whose paths answers may quote (trace_dir, the compile cache's),
        shown relative to them; empty ones are skipped. Each is known by its real path too, read
        once here: the scan names the models folder's files from its real path (layout.scan), and
        a models folder given as a link to `/x/real/My Models` showed `My Models/m.yaml`."""
        # the models folder as the repository names it (made absolute, a `..` after a link kept: the OS resolves it
        # after the link, abspath before it) and as abspath tidies it
        self._models = {str(Path(os.getcwd(), models_dir)), os.path.abspath(models_dir)}
        given = {os.path.abspath(folder) for folder in known if folder} | self._models
        self._as_given = {os.path.realpath(folder): folder for folder in given}  # a spelling -> the folder
        self._as_given.update((folder, folder) for folder in given)
        self._as_given.pop(os.sep, None)
        either = "|".join(re.escape(folder) for folder in sorted(self._as_given, key=len, reverse=True))
        self._paths = re.compile(rf"{_NOT_AFTER}(?P<folder>{either}){_FOLDER_ENDS}(?P<rest>(?:/{_PART}*)*)"
                                 rf"|{_ABSOLUTE}" if either else _ABSOLUTE)

    def __call__(self, text: str) -> str:
        text = cut(text, MAX_TEXT)
        if "/" not in text:
            return text
        return self._paths.sub(self._replace, text)

    def _replace(self, match: re.Match) -> str:
        folder = match.groupdict().get("folder")
        if folder is not None:
            folder = self._as_given[folder]
            rest = match["rest"]
            if folder in self._models:
                return "<models>" + rest
            inside = rest.lstrip("/")
            return inside if inside.strip("/.") else os.path.basename(folder) + rest
        path = match.group(0).rstrip(".")
        tail = match.group(0)[len(path):]
        first, sep, rest = path[1:].partition("/")
        if not sep or not rest.strip("/") or first in _ROUTES:
            return match.group(0)
        return os.path.basename(path.rstrip("/")) + tail
