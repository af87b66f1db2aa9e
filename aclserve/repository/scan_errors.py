"""A bug of the models folder's scan, logged with its traceback once per model and failure.

The scan runs every few seconds in poll mode (and on each load call): a model whose files the
scan cannot handle would log the same traceback at every rescan, forever. The first is logged
at ERROR; the same failure (type and message) again at DEBUG; it is logged at ERROR again when
it changes, or after the model scanned fine (or left the folder). Any thread (a lock).
"""
from __future__ import annotations

import logging
import threading


class ScanErrors:
    """The failures said so far, by (models folder, model name)."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._said: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def failed(self, folder: str, name: str, error: BaseException) -> None:
        """Log `error` (raised scanning model `name` of `folder`) with its traceback, at ERROR
        when it was not the model's failure last said, else at DEBUG."""
        failure = f"{type(error).__qualname__}: {error}"
        with self._lock:
            new = self._said.get((folder, name)) != failure
            self._said[(folder, name)] = failure
        level = logging.ERROR if new else logging.DEBUG
        again = "" if new else " (again, as in an earlier scan)"
        self._log.log(level, "model %s: scanning its files failed%s", name, again, exc_info=error)

    def scanned(self, folder: str, failed: set[str]) -> None:
        """A scan of `folder` ended; `failed`: its models that failed it. The others are forgotten."""
        with self._lock:
            for key in [k for k in self._said if k[0] == folder and k[1] not in failed]:
                del self._said[key]
