"""Why a request's model or version is not served: the error it is answered with.

A 503 (ModelUnavailable, with Retry-After) only where the version will serve without anyone's
help: loading, waiting for its files, a retry due. What a client retrying would loop on until
someone acts is a 404 (NotFound), as Triton's "has no available versions": a model unloaded
through the API, a file refused for good, a model's broken files, a version its policy does not
select, one never asked for in the explicit and none modes, an unknown name. Owned by the
ModelRepository, reading the state its parts keep (lifecycle, planner, failures, control calls).
"""
from __future__ import annotations

from ..errors import ModelUnavailable, NotFound, ServeError
from .index import as_shown
from .layout import KNOWN_SUFFIXES
from .names import check_model_name
from .status import NOT_LOADED, UNLOADED, WAITING_FOR_CONFIG, State

# why a version on disk that no load call named is not loaded, by control mode (explicit, none)
NOT_ASKED = {"explicit": "explicit: a load call serves it", "none": "none: models load at start only"}


def refused_files(name: str, problems: dict[str, str]) -> str:
    """For a request of `name`, a name no model may have, the files of that name the models folder
    holds, refused by its scan for the name (the index lists them): ": the models folder has my
    model.om, whose name is refused: <why>", or "" (none, or a name a model may have). A folder of
    the name is a model known by its problem already ("has no available versions (<why>)"). Files
    are named as the index shows them, relative to the folder: bytes that are not UTF-8 as \\xNN,
    the only spelling a client can send of them (a URL's name is decoded as UTF-8)."""
    if check_model_name(name) is None:
        return ""
    found = [name + suffix for suffix in KNOWN_SUFFIXES if name + suffix in problems]
    if not found:
        return ""
    return f": the models folder has {' and '.join(found)}, whose name is refused: {problems[found[0]]}"


def held_refusal(name: str, version: str | None) -> str:
    """What a request for a model held unloaded by an API unload is told, in a 404: no wait
    brings it back, only a load call (Triton's words when it names no version)."""
    if version is None:
        return f"model {name} has no available versions ({UNLOADED})"
    return (f"model {name} version {version} is not available ({UNLOADED} through the repository API: "
            "a load call serves it)")


class WhyNotServed:
    """The answer to a request no serving version takes, from the repository's parts' state."""

    def __init__(self, mode: str, lifecycle, planner, failures, calls):
        self._mode = mode
        self._lifecycle, self._planner, self._failures, self._calls = lifecycle, planner, failures, calls

    def error(self, name: str, version: str | None, versions: dict | None) -> ServeError:
        """The error for a request of `name` (`version`: None, the newest) that no serving
        version answers; `versions`: the model's serving ones (by version), if any."""
        scan, states, held = self._planner.scan, self._lifecycle.states, name in self._lifecycle.held
        known = states.describe(name, version, scan, held, self._planner.pending)
        if held and (version is None or known is not None):  # unloaded on purpose: a 404, not a 503 to
            return NotFound(held_refusal(name, version))  # retry, as only a load call serves it again
        if known is None and states.describe(name, None, scan) is None:
            known = self._calls.unlisted(name)  # a load call may find it: loading, not unknown
        if known is not None:
            return self._known(name, version, versions, known)
        if version in scan.versions_found.get(name, ()) and (
                name in scan.models or name in scan.selects_none
                or version in self._planner.kept_unselected().get(name, ())):
            # on disk, and its policy does not select it (the one it reads; while its config does not
            # read, the one its versions serving on loaded with): as the index says
            return NotFound(f"model {name} version {version} is not selected by its version_policy")
        if versions or name in scan.models:
            return NotFound(f"model {name} has no version {version}")
        return NotFound(f"unknown model {name!r}{refused_files(name, scan.problems)}")

    def _known(self, name: str, version: str | None, versions: dict | None, known: tuple) -> ServeError:
        """The error for a version the repository knows (`known`: VersionStates.describe's)."""
        shown_version = version or self._lifecycle.states.latest_recorded(name)  # (the one `known` is of)
        state, reason, retry_in = as_shown(self._calls, self._failures, name, shown_version, *known)
        if reason == NOT_LOADED and self._mode != "poll" and not self._lifecycle.tasks.busy(name):
            # found by a rescan (another model's load call, a retry's), never loaded: only a load call
            # would load it, so not a retry-later (a 503 for good); Triton: unknown model
            return NotFound(f"model {name}{' version ' + version if version else ''} is not loaded "
                            f"(model_control_mode {NOT_ASKED[self._mode]})")
        if state == State.UNAVAILABLE.value and (self._failures.refused_for_good(name, version)
                                                 or (not versions and name in self._planner.scan.problems
                                                     and reason != WAITING_FOR_CONFIG)):
            # its file was refused and no retry is due, or its files are (a broken config, a
            # version folder that is no version): not a retry-later (Triton: 404, "has no
            # available versions"); a client retrying a 503 would loop on it until they change
            return NotFound(f"model {name} version {version} is not available ({reason})" if version
                            else f"model {name} has no available versions ({reason})")
        error = ModelUnavailable(f"model {name}{' version ' + version if version else ''} is not ready"
                                 f" ({state}{': ' + reason if reason else ''})")
        error.retry_after_s = retry_in or None  # when its retry is due, as said (None, due now: 1 s)
        return error
