"""The repository API's load and unload calls: the models asked for, the loads running, the calls' order.

Calls on one model take effect in the order they arrive (README, "Model repository"). Three
questions need what was asked, not the state it left:
- Which models does readiness wait for? In explicit and none modes, those the start loaded and
  those a load call named since (`asked`; a load call rescans the folder, and a model staged in
  it is no reason to leave the balancer); a load that was a 404 names none. None in poll mode:
  every model the folder holds. In every mode, too, each model a load call is loading: no
  listing may know it yet (`awaited`).
- Was a load overtaken? A load answers 400 when an unload of its model arrived after it and
  before it answered. A set of "unloaded" names could not tell: a load arriving after the
  unload cleared it, and the first load's answer then depended on the third call (load, unload
  0.3 s later, load 0.3 s after that answered the first load 200; without the third, 400).
- What does a call the shutdown overtook answer? 503 / UNAVAILABLE (`shut_down_before`), not
  the model's failure: another replica may do it. The server writes that answer before it closes
  the call's connection (a load waiting for the start's load of its model, which the shutdown
  cancels, was dropped without one).
- Is the model being loaded? From the moment a load is asked, its versions that wait for it
  (unloaded, or on disk and not loaded yet) are LOADING: until the load's task began (it reads
  the folder first, waiting for another scan or an unload of the model), a client polling the
  model was told "UNAVAILABLE: unloaded". Not once an unload came after it: that one wins. A
  model no listing knows yet (copied in since) is LOADING too, as the model's own (`unlisted`):
  until the call's read ended, its /ready and infer answered 404 "unknown model" while the
  server's readiness already waited for it.
Owned by the ModelRepository; loop thread only.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from ..errors import ShuttingDown
from .status import HELD, NOT_LOADED, UNLOADED, State

LOAD_ASKED = "load asked through the repository API: reading the models folder"


def shut_down_before(name: str, done: str) -> ShuttingDown:
    """The answer to a load ("loaded") or unload ("unloaded") call of `name` the shutdown overtook."""
    more = " (its shutdown unloads every model)" if done == "unloaded" else ""
    return ShuttingDown(f"the model repository shut down before {name} was {done}{more}")


class ControlCalls:
    def __init__(self):
        self.asked: set[str] | None = None  # the models readiness waits for (None: all; see above)
        self._calls = 0  # load and unload calls so far, numbered in arrival order
        self._last_unload: dict[str, int] = {}  # model -> number of its latest unload call
        self._loading: dict[str, set[int]] = {}  # model -> numbers of its load calls running

    @contextlib.contextmanager
    def load(self, name: str) -> Iterator[Callable[[], bool]]:
        """Around a load call of `name` (asked from now on: while it loads it holds readiness
        back, as Triton's does): yields `overtaken()`, true once an unload of `name` arrived
        after this call (whatever came after that unload)."""
        self._calls += 1
        number = self._calls
        if self.asked is not None:
            self.asked.add(name)
        self._loading.setdefault(name, set()).add(number)
        try:
            yield lambda: self._last_unload.get(name, 0) > number
        finally:
            self._loading[name].discard(number)
            if not self._loading[name]:
                del self._loading[name]

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
        """A load of `name` found no model: none to wait for (its file may come later, unasked)."""
        if self.asked is not None:
            self.asked.discard(name)

    def unload(self, name: str) -> None:
        """An unload call of `name` arrived (a known model: the names stay few)."""
        self._calls += 1
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
