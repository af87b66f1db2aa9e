"""The repository index: each version's state and reason, merged with what is on disk.

Owned by the ModelRepository and used on the loop only. Recorded states are LOADING, READY
(reason set when a newer file for it was refused), UNAVAILABLE (reason) and UNLOADING; files on
disk without a record show as UNAVAILABLE with why ("not loaded", "not selected by the version
policy", "waiting for the file to be complete"); scan problems (bad names, bad configs,
symlinks out of the repository) show with an empty version.
"""
from __future__ import annotations

from .layout import ScanResult
from .served import READY, UNAVAILABLE


class StatusBoard:
    def __init__(self):
        self.states: dict[tuple[str, str], tuple[str, str]] = {}

    def set(self, name: str, version: str, state: str, reason: str = "") -> None:
        self.states[(name, version)] = (state, reason)

    def get(self, name: str, version: str) -> tuple[str, str] | None:
        return self.states.get((name, version))

    def drop(self, name: str, version: str) -> None:
        self.states.pop((name, version), None)

    def model_status(self, name: str, scan: ScanResult) -> tuple[str, str] | None:
        """The latest record of any version of `name`, else what the scan knows, else None."""
        rows = [value for (n, _), value in self.states.items() if n == name]
        if rows:
            return rows[-1]
        if name in scan.models or name in scan.problems:
            return (UNAVAILABLE, scan.problems.get(name, "not loaded"))
        return None

    def forget_stale(self, scan: ScanResult, refused: set[tuple[str, str]]) -> None:
        """Drop UNAVAILABLE records of files gone from disk; clear the 'new file refused'
        reason of READY versions whose refused file is gone."""
        for key, (state, reason) in list(self.states.items()):
            name, version = key
            on_disk = name in scan.models and version in scan.models[name].available
            if state == UNAVAILABLE and not on_disk:
                del self.states[key]
            elif state == READY and reason and key not in refused:
                self.states[key] = (READY, "")

    def index(self, scan: ScanResult, pending: dict[str, list[str]], ready_only: bool = False) -> list[dict]:
        rows: dict[tuple[str, str], tuple[str, str]] = {}
        for name, reason in scan.problems.items():
            rows[(name, "")] = (UNAVAILABLE, reason)
        for name, entry in scan.models.items():
            for version in entry.available:
                rows[(name, version)] = (UNAVAILABLE, "not loaded" if version in entry.selected
                                         else "not selected by the version policy")
            waiting = set(pending.get(name, ()))
            for version, found in entry.available.items():
                if found.path in waiting and (name, version) not in self.states:
                    rows[(name, version)] = (UNAVAILABLE, "waiting for the file to be complete")
        rows.update(self.states)
        out = [{"name": n, "version": v, "state": s, "reason": r} for (n, v), (s, r) in rows.items()]
        out.sort(key=lambda row: (row["name"], int(row["version"]) if row["version"].isdigit() else 0))
        return [row for row in out if row["state"] == READY] if ready_only else out
