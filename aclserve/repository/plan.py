"""Desired state and the pure diff that turns two of them into per-model actions.

A desired state maps model name -> version -> Wanted(file, config). Comparing the one last
acted on with a new one gives, per model, the versions to (re)load and the versions to
unload. A version is reloaded when its file's identity (path, size, mtime, ctime, inode; the same
of its config and labels files: layout.VersionFile) or its model config changed, except when the
config's version_policy is all that changed: that only chooses which versions serve, so a
version it keeps serves on as it is (kept), and only the versions it adds or drops load or
unload. No I/O here: the repository feeds scans in and executes the plans.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from ..config import ModelConfig
from .layout import VersionFile, version_sort_key


@dataclass(frozen=True)
class Wanted:
    file: VersionFile
    config: ModelConfig

    def same_as(self, other: "Wanted | None") -> bool:
        return other is not None and self.file.identity == other.file.identity and self.config == other.config

    def reselects(self, other: "Wanted | None") -> bool:
        """The same model file, labels files and config as `other` but for the config's
        version_policy (so its config file's identity differs too): nothing it serves with changed."""
        return (other is not None and self.config.version_policy != other.config.version_policy
                and self.file.model_identity == other.file.model_identity
                and self.labels_stamp() == other.labels_stamp()
                and replace(self.config, version_policy=other.config.version_policy) == other.config)

    def changed_from(self, old: "Wanted") -> str:
        """What changed since `old` (a reload), as its log and a refusal name it: a config or
        labels file edited alone is not "the new file" (nor a labels file "the new config"), nor is
        an .onnx's external data file changed alone (a tester read "its new file" of one)."""
        if old.file.model_identity != self.file.model_identity:
            weights_alone = (replace(old.file, data_stamp=self.file.data_stamp).model_identity
                             == self.file.model_identity)
            return "weights file" if weights_alone else "file"
        if old.config == self.config and old.labels_stamp() != self.labels_stamp():
            return "labels file"
        return "config"

    def reload_said(self, old: "Wanted") -> str:
        """Why it reloaded over `old`, as its log line says it: "its new file" (config, labels
        file, weights file), and when its config file is gone or another is read instead, that and what it serves
        with now (it said "its new config" when the file was deleted: a tester read that as a config
        of its own)."""
        said = f"its new {self.changed_from(old)}"
        before, now = old.config_path(), self.config_path()
        if before is None or before == now:
            return said
        before_said, now_said = told_apart(before, now)
        settings = "the server's model_defaults" if now is None else f"{now_said}'s settings"
        # (one still there was set aside for another that came, config.yaml beside a config.pbtxt: reviewer r21)
        went = "set aside" if os.path.exists(before) else "removed"
        removed = f"its config {before_said} {went}: it serves with {settings} now"
        return removed if old.file.model_identity == self.file.model_identity else f"{said}; {removed}"

    def config_path(self) -> str | None:
        """The config file it was read from (None: the defaults alone)."""
        labels = self._labels()
        return next((entry[0] for entry in self.file.config_stamp if entry[0] not in labels), None)

    def labels_stamp(self) -> frozenset:
        """The identities of the labels files its config names."""
        labels = self._labels()
        return frozenset(entry for entry in self.file.config_stamp if entry[0] in labels)

    def _labels(self) -> set[str]:
        return {o.labels for o in self.config.outputs.values() if o.labels}


def told_apart(before: str, now: str | None) -> tuple[str, str]:
    """Two config paths as the log says them: their file names, or, when those are the same (the
    models path a link switched to another folder: gen1/m.yaml, then gen2/m.yaml), as many of
    their last parts as tell them apart (a tester read "m.yaml set aside: it serves with m.yaml's
    settings" as a contradiction)."""
    if now is None:
        return os.path.basename(before), ""
    a, b = before.split(os.sep), now.split(os.sep)
    kept = 1
    while kept < min(len(a), len(b)) and a[-kept:] == b[-kept:]:
        kept += 1
    return os.sep.join(a[-kept:]), os.sep.join(b[-kept:])


DesiredState = dict[str, dict[str, Wanted]]


@dataclass
class ModelPlan:
    """What to do to one model: load (beside the serving ones) then swap, then unload."""

    name: str
    load: dict[str, Wanted] = field(default_factory=dict)  # version -> what to load
    unload: list[str] = field(default_factory=list)  # versions to drain and unload
    # version -> what it now serves as: only the version_policy changed (Wanted.reselects), no reload
    keep: dict[str, Wanted] = field(default_factory=dict)
    unload_cause: str = ""  # why, when the plan's maker knows (the log and the index say it)

    def __bool__(self) -> bool:
        return bool(self.load or self.unload or self.keep)


def diff(old: DesiredState, new: DesiredState, unload_missing: bool = True) -> list[ModelPlan]:
    """Plans turning `old` into `new`, one per model that changes, sorted by name.

    With unload_missing=False a model that vanished entirely is kept (config.unload_on_delete);
    versions dropped by a still-present model are always unloaded.
    """
    plans = []
    for name in sorted(set(old) | set(new)):
        before, after = old.get(name, {}), new.get(name)
        if after is None and not unload_missing:
            continue
        after = after or {}
        plan = ModelPlan(name)
        for version in sorted(after, key=version_sort_key):
            wanted, was = after[version], before.get(version)
            if wanted.reselects(was):
                plan.keep[version] = wanted
            elif not wanted.same_as(was):
                plan.load[version] = wanted
        plan.unload = sorted((v for v in before if v not in after), key=version_sort_key)
        if plan:
            plans.append(plan)
    return plans

