"""Readiness: whether every model that should be served is (GET /v2/health/ready; README "Readiness").

Which models should be served: those the folder holds as last listed (a model with a version its
policy selects, or a scan problem: a broken config, a bad name), not unloaded on purpose; in
explicit and none modes only those the start loaded or a load call named (ControlCalls.awaited);
and in every mode each model a load call is loading, listed yet or not. That call reads the folder
before its model's load begins, and a model copied in since the last listing was in no listing
until that read ended: the server said ready while it had been asked for a model it did not serve.

Strict (the default): all of them serve. Lenient: a model whose file or config was refused does
not hold readiness back, nor one waiting for room on its device (nothing but room given back there
tries it again: as one whose retry has failed again); one still settling, loading (a load tried
again as room came back too) or waiting for its first retry does, and only until readiness has
been reached once (latched: replicas sharing a folder would all leave their balancer while a
model dropped into it loads, an ATC compile taking minutes); and, latched
or not, one model at least serves when any should (every one refused, as by an image or node
whose runtime loads none of the folder's OMs, was ready serving nothing, and a rolling update
replaced serving replicas with it). In both, a model that no instance can run turns it off.
What holds it back is said in the log's lines (`not_serving`: how many models, why, the first few
names; server/readiness_log.py): a strict server of more models than its devices hold stays
unready while the loads past them wait for room.
Owned by the ModelRepository; loop thread only.
"""
from __future__ import annotations

import logging

from ..quoting import listed_names
from .control_calls import ControlCalls
from .failures import LoadFailures
from .lifecycle import Lifecycle
from .planner import Planner
from .status import WAITING_FOR_CONFIG

log = logging.getLogger(__name__)

NAMED = 3  # the models a group of not_serving names, the others counted
LOADING, NOT_YET = "loading", "still to load"  # not_serving's whys that change by themselves


class Readiness:
    def __init__(self, strict: bool, lifecycle: Lifecycle, planner: Planner, failures: LoadFailures,
                 calls: ControlCalls):
        self._strict = strict
        self._lifecycle, self._planner, self._failures, self._calls = lifecycle, planner, failures, calls
        self._said_ready = False  # lenient readiness was reached once: later loads do not undo it
        self._said_none_serves = False  # ... with no model serving: said once in the log

    def ready(self) -> bool:
        """Whether the repository (started, not closed: the caller's to tell) serves what it should."""
        serving = self._lifecycle.serving
        # judged by the folder as last listed: one that cannot be listed now tells nothing (what
        # serves is kept, and so is readiness); one never listed, nothing is ready
        listed = self._planner.listed
        if listed is None:
            return False
        if self._out_of_service():
            return False  # a model served by no instance (pool.out_of_service), in both modes
        found, problems = self._planner.wanted_models(), set(listed.problems)
        awaited = self._awaited(found, problems)
        if self._strict:
            return all(n in serving for n in awaited)
        # (a model a load call names and no listing knows yet is a model to load: wanted)
        wanted, problems = awaited - (problems - found), awaited & problems
        self._said_ready = self._said_ready or self._lenient_ready(listed, wanted, problems)
        if serving or not awaited:  # one model serves, or none should: latched, it is ready
            self._said_none_serves = False
            return self._said_ready
        if self._said_ready and not self._said_none_serves:
            self._said_none_serves = True  # (a pod that stays unready must say why, once)
            log.warning("not ready: no model serves (readiness: lenient needs one while the repository has any; "
                        "the repository index says why each does not)")
        return False

    def not_serving(self) -> tuple[str, bool]:
        """What holds readiness back, for the log (server/readiness_log.py): the models that should
        serve and do not, grouped by why, each group naming its first NAMED (`144 models not serving:
        device 0 short of streams or events (m57, m58, m59 and 141 more)`; "" for none), and whether
        that stays so until something happens (no model loading or still to load, which say little)."""
        listed, serving = self._planner.listed, self._lifecycle.serving
        if listed is None:
            return "the models folder not listed yet", False
        awaited = self._awaited(self._planner.wanted_models(), set(listed.problems))
        room = self._failures.waiting_for_room()  # (in the order refused: the order they load in as room frees)
        turn = {name: k for k, name in enumerate(room)}
        failed = {n for n, _ in self._failures.versions()}
        groups: dict[str, list[str]] = {}
        for name in sorted(awaited - set(serving), key=lambda n: (turn.get(n, len(turn)), n)):
            if self._lifecycle.tasks.busy(name):
                why = LOADING
            elif name in room:
                why = "device {} short of {}".format(*room[name])
            elif name in listed.problems and listed.problems[name] != WAITING_FOR_CONFIG:
                why = "files that cannot be served as they are"
            elif name in failed:
                why = "their load failed"
            else:  # (settling, its config being written, its load about to begin)
                why = NOT_YET
            groups.setdefault(why, []).append(name)
        if down := self._out_of_service():
            groups["no instance can run"] = down
        count = sum(len(names) for names in groups.values())
        said = "; ".join(f"{why} ({listed_names(names, NAMED)})" for why, names in groups.items())
        return f"{count} model{'s' if count > 1 else ''} not serving: {said}" if count else "", not (
            LOADING in groups or NOT_YET in groups)

    def _awaited(self, found: set[str], problems: set[str]) -> set[str]:
        """The models that should serve, of those the folder holds (`found`) and cannot serve as they are."""
        return self._calls.awaited(found | problems) - self._lifecycle.held

    def _out_of_service(self) -> list[str]:
        """The models served by no instance (pool.out_of_service)."""
        return [name for name, versions in sorted(self._lifecycle.serving.items())
                if all(sv.pool.out_of_service() for sv in versions.values())]

    @property
    def reached(self) -> bool:
        """Lenient readiness's first loads have ended (refused or serving), whether or not a model serves."""
        return self._said_ready

    def note(self) -> None:
        """Whether lenient readiness is reached, looked at whenever a model's task ends or a scan
        is planned, not only when a probe asks: whether a replica stays ready while a model
        dropped in later loads must not depend on when its probe came."""
        if not self._strict and not self._said_ready:
            self.ready()  # (latches)

    def _lenient_ready(self, listed, wanted: set[str], problems: set[str]) -> bool:
        """Every wanted model serves or was refused, and none of `problems` (the listing's,
        awaited and not held) waits for its config still being written."""
        serving = self._lifecycle.serving
        # a model refused does not hold it back, unless a load call tries it again; one whose first retry
        # is still to come does, as one loading does (not every retry: they go on for good, and readiness
        # would never come; a later retry's load comes after readiness was reached, between two retries)
        failed = {n for n, _ in self._failures.versions()} - self._failures.first_retry_pending()
        failed -= self._calls.loads_running()
        waiting = {n for n in problems if listed.problems[n] == WAITING_FOR_CONFIG}
        return not (waiting - set(serving)) and all(
            n in serving or (n in failed and not self._lifecycle.tasks.busy(n)) for n in wanted)
