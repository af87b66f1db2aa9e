"""The repository API's load and unload calls: the models asked for, the loads running, the calls' order.

Calls on one model take effect in the order they arrive (README, "Model repository"). Three
questions need what was asked, not the state it left:
- Which models does readiness wait for? In explicit and none modes, those the start loaded and
  those a load call named since (`asked`; a load call rescans the folder, and a model staged in
  it is no reason to leave the balancer); a load of no model (a 400) names none. None in poll mode:
  every model the folder holds. In every mode, too, each model a load call is loading: no
  listing may know it yet (`awaited`).
- Was a load overtaken? A load answers 400 when an unload of its model arrived after it and
  before it answered. A set of "unloaded" names could not tell: a load arriving after the
  unload cleared it, and the first load's answer then depended on the third call (load, unload
  0.3 s later, load 0.3 s after that answered the first load 200; without the third, 400).
- What does a call the shutdown overtook answer? 503 / UNAVAILABLE (`shut_down_before`), not
  the model's failure: another replica may do it. The server writes that answer before it closes
  the call's connection (a load waiting for the start's load of its model, which the shutdown
  cancels, was dropped without one). A load call that loads its model once the server is
  `shutting_down` (in its drain, before the repository closes) is answered 503 all the same
  (`not_served_after_shutdown`): the close unloads the model at once (it was answered 200).
- Is the model being loaded? From the moment a load is asked, its versions that wait for it
  (unloaded, or on disk and not loaded yet) are LOADING: until the load's task began (it reads
  the folder first, waiting for another scan or an unload of the model), a client polling the
  model was told "UNAVAILABLE: unloaded". Not once an unload came after it: that one wins. A
  model no listing knows yet (copied in since) is LOADING too, as the model's own (`unlisted`):
  until the call's read ended, its /ready and infer answered 404 "unknown model" while the
  server's readiness already waited for it.
- What is kept of a name? An unload's number only while loads of the name run (the ones it may
  overtake). An unload naming no model is taken while a load call of the name runs (it may find
  a model copied in since; Triton answers 200 to any unload, its UnloadModel of a name it does
  not know unloading nothing), else a 404. Once the last load call of a name ends, however it
  ended (no model found, or cancelled: its client gone), a name nothing knows (no serving
  version, listing or record: `known`) is no longer asked nor held (Lifecycle.held, which the
  unload added it to): load + unload pairs of made-up names kept both for good.
Owned by the ModelRepository; loop thread only.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from ..errors import InvalidInput, ShuttingDown
from .status import HELD, NOT_LOADED, UNLOADED, State

LOAD_ASKED = "load asked through the repository API: reading the models folder"


def check_control_mode(mode: str, what: str) -> None:
    """InvalidInput (400) when `mode` (model_control_mode) takes no model `what` ("load", "unload")
    through the API: in `none` mode nothing does, whatever the caller (server/auth.py refuses so
    before advising a token, which would not help)."""
    if mode == "none":
        raise InvalidInput(f"model {what} is disabled (model_control_mode is none)")


def not_served_after_shutdown(name: str) -> ShuttingDown:
    """The answer to a load call of `name` that ended once the server was shutting down: what it
    loaded is unloaded at once (a 200 for it told of a model never served)."""
    return ShuttingDown(f"the server is shutting down: {name} will not be served (its shutdown unloads every model)")


def shut_down_before(name: str, done: str) -> ShuttingDown:
    """The answer to a load ("loaded") or unload ("unloaded") call of `name` the shutdown overtook."""
    more = " (its shutdown unloads every model)" if done == "unloaded" else ""
    return ShuttingDown(f"the model repository shut down before {name} was {done}{more}")


class ControlCalls:
    def __init__(self, known: Callable[[str], bool], held: set[str]):
        """`known(name)`: whether the repository knows a model `name`; `held`: the models unloaded
        through the API (Lifecycle.held), from which the last load call of a name no model has drops it."""
        self._known, self._held = known, held
        self.asked: set[str] | None = None  # the models readiness waits for (None: all; see above)
        self._calls = 0  # load and unload calls so far, numbered in arrival order
        self._last_unload: dict[str, int] = {}  # model -> number of its latest unload call, while loads of it run
        self._loading: dict[str, set[int]] = {}  # model -> numbers of its load calls running
        self.shutting_down = False  # the server is (set once, as its drain begins): no load is served

    @contextlib.contextmanager
    def load(self, name: str) -> Iterator[Callable[[], bool]]:
        """Around a load call of `name` (asked from now on: while it loads it holds readiness
        back, as Triton's does): yields `overtaken()`, true once an unload of `name` arrived
        after this call (whatever came after that unload). A call that loads its model once the server
        is `shutting_down` raises ShuttingDown as it ends."""
        self._calls += 1
        number = self._calls
        if self.asked is not None:
            self.asked.add(name)
        self._loading.setdefault(name, set()).add(number)
        try:
            yield lambda: self._last_unload.get(name, 0) > number
            if self.shutting_down:  # loaded, for the shutdown to unload at once: not served
                raise not_served_after_shutdown(name)
        finally:
            self._loading[name].discard(number)
            if not self._loading[name]:  # the last one, however it ended
                del self._loading[name]
                self._last_unload.pop(name, None)  # (it tells nothing once no load of the name runs)
                if not self._known(name):  # no model's (none found, or the call cancelled): nothing kept
                    self.no_such_model(name)
                    self._held.discard(name)

    def loading(self, name: str) -> bool:
        """Whether a load call of `name` runs (it may be about to find a model no scan listed yet)."""
        return name in self._loading

    def loads_running(self) -> set[str]:
        """The models a load call is loading: one runs, and no unload of the model came after it."""
        return {name for name in self._loading if self._load_runs(name)}

    def awaited(self, found: set[str]) -> set[str]:
        """The models readiness waits for: of `found` (the folder's, as last listed) those asked
        (all in poll mode), and those a load call is loading, found or not (its call reads the
        folder first: until that read ended, a model copied in since the last one was not awaited)."""
        return (found if self.asked is None else found & self.asked) | self.loads_running()

    def no_such_model(self, name: str) -> None:
        """A load of `name` found no model, or the last one ended with nothing knowing the name
        (cancelled, say): none to wait for (its file may come later, unasked)."""
        if self.asked is not None:
            self.asked.discard(name)

    def unload(self, name: str) -> None:
        """An unload call of `name` arrived: kept while loads of it run, the ones it overtakes (so the
        names stay as few as the loads running, made-up names included)."""
        self._calls += 1
        if name in self._loading:
            self._last_unload[name] = self._calls

    def shown(self, name: str, state: str, reason: str) -> tuple[str, str]:
        """(state, reason) of a version of `name` as clients see it: LOADING while a load call
        runs for a version waiting for it (its own record moves once its load has begun) and no
        unload came after the call."""
        if self._load_runs(name) and state == State.UNAVAILABLE.value and reason in (UNLOADED, NOT_LOADED, HELD):
            return State.LOADING.value, LOAD_ASKED
        return state, reason

    def unlisted(self, name: str) -> tuple[str, str] | None:
        """(state, reason) of `name` when nothing else knows it (no listing, no record): LOADING while
        a load call of it runs that no unload came after (it may find the model); None otherwise."""
        return (State.LOADING.value, LOAD_ASKED) if self._load_runs(name) else None

    def _load_runs(self, name: str) -> bool:
        """A load call of `name` runs that no unload of it came after."""
        return max(self._loading.get(name, ()), default=0) > self._last_unload.get(name, 0)
