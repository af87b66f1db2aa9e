"""Which versions a plan's swap takes out of service once its loads have ended, and why each goes.

A plan loads versions and unloads those they take over from (an older one under a `latest`
policy), those whose files are gone, or all (an unload through the API). Its loads may not all
get in: one failed, or (poll mode) one fell through as the folder changed while it loaded: its
compile stopped as its file went or was replaced (running_compiles.py), or it loaded but the
folder no longer wants it (`why_not_wanted`). The versions it was to push out then serve on while
their files are there: taken out, the model served nothing until a rescan (up to 10 s) or until
the replaced file's new compile had loaded. Pure decisions over the Planner's scan: the Lifecycle
moves the states.
"""
from __future__ import annotations

from .layout import VersionFile
from .plan import DesiredState, ModelPlan
from .planner import FILE_GONE, Planner
from .served import ServedVersion

# why a version was unloaded (the log and its UNLOADING reason; unload_cause names the others: FILE_GONE...)
UNLOAD_ASKED = "asked through the repository API"  # (ModelRepository.unload's plans)
NOT_SELECTED = "no longer selected by its version_policy"  # (its config changed)


def why_not_wanted(planner: Planner, name: str, version: str, file: VersionFile) -> str:
    """Poll mode, a load of `version` of `name` from `file` ended: why the folder no longer wants
    it (deleted, replaced, or dropped by its policy or a config that does not read as it loaded:
    no plan said so, as the diff compares with what serves), else ""."""
    return planner.file_changed(name, version, file) or (
        "" if planner.still_wanted(name, version) else planner.scan.problems.get(name, NOT_SELECTED))


def unloads_left(plan: ModelPlan, planner: Planner, acted: DesiredState, held: set[str], failed: bool,
                 fell_through: bool) -> list[str]:
    """`plan.unload` less the versions that serve on: when a load `failed`, those whose files are
    still on disk; when one `fell_through` (poll mode: above), those whose files are not gone (the
    rescan at the task's end looks at the model again). A model unloaded through the API meanwhile
    (`held`) keeps none."""
    name = plan.name
    unload = list(plan.unload)
    if name in held:
        return unload
    if failed:
        unload = [v for v in unload if not planner.on_disk(name, v)]
    if fell_through:
        unload = [v for v in unload if planner.file_gone(name, v, acted[name][v].file.path)]
    return unload


def unload_cause(plan: ModelPlan, version: str, loaded: dict[str, ServedVersion], planner: Planner,
                 held: set[str], serving: dict[str, ServedVersion]) -> str:
    """Why `plan` takes `version` out of service (`serving`: its model's versions in service), in
    a few words for the log and its UNLOADING reason (they said "version 1 unloaded" alike for an
    API call, a file deleted, a policy). An API unload says so itself (a load that came after it
    has cleared `held` by now), or, the model still held, through the plan of a load that failed
    meanwhile (the unload then found nothing of its own to do). A newer version takes its place
    only under the same version_policy: one edited drops it whatever loads with it (an edit of the
    policy alone loads only the versions it adds: plan.keep)."""
    if plan.unload_cause:
        return plan.unload_cause
    if not planner.on_disk(plan.name, version):
        return FILE_GONE
    if plan.name in held:  # unloaded through the API while a load of the model ran (and failed)
        return UNLOAD_ASKED
    policies = {w.config.version_policy for w in (*plan.load.values(), *plan.keep.values())}
    newer = [v for v in loaded if int(v) > int(version)]
    if newer and version in serving and policies == {serving[version].wanted.config.version_policy}:
        return f"version {max(newer, key=int)} took its place under its version_policy"
    return NOT_SELECTED
