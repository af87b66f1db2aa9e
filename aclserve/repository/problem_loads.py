"""A model whose files cannot be served as they are (its config does not read, a version_policy
that selects none of its versions, a flat file beside its folder: the scan's problem of the model,
its index row with no version) is a failed load of the model: the repository's `load_failed`
event with the version empty, which aclserve_model_loads_total{result="failed"} counts
(server/model_series.py), as it counts a version's file that failed to load.

Once per failure, not per scan: a load call refused for it is one; so is a problem found by a
scan that loads what it finds (the start's in every control mode, poll mode's after), once while
it lasts (the next scans finding the same reason find the same failure; another reason, or the
problem back after it went, is a new one). The scans of explicit and none modes after the start
(an index read, another model's load call) load nothing of the model: no failure of it. A config
still being written is no failure yet (WAITING_FOR_CONFIG), and what is no model's name (a file
the scan cannot take for a model, the folder itself) has no model to fail. Loop thread only.
"""
from __future__ import annotations

from typing import Callable

from .layout import ScanResult
from .names import check_model_name
from .status import WAITING_FOR_CONFIG


class ProblemLoads:
    def __init__(self, emit: Callable):
        self._emit = emit  # events.Listeners.emit
        self._counted: dict[str, str] = {}  # model -> the problem last counted a failed load of it

    def scanned(self, scan: ScanResult, loads: bool) -> None:
        """After a reconcile's plans (its problems final: a config being written said so);
        `loads`: that reconcile loads what its scan found."""
        if not loads or scan.unreadable:  # (a folder that cannot be listed tells nothing of its models)
            return
        found = {name: reason for name, reason in scan.problems.items()
                 if reason != WAITING_FOR_CONFIG and check_model_name(name) is None}
        for name, reason in found.items():
            if self._counted.get(name) != reason:
                self._emit("load_failed", name, "", reason=reason)
        self._counted = found

    def refused(self, name: str, reason: str) -> None:
        """A load call of model `name` refused for its problem `reason`."""
        self._counted[name] = reason  # (poll mode's next scan finds the failure this call counted)
        self._emit("load_failed", name, "", reason=reason)
