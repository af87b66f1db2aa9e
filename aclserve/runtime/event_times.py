"""A batch's phase times from its slot's events: H2D, compute and D2H, as the device measured them."""
from __future__ import annotations

from ..acl import check
from .types import DeviceTimings


def phase_events(events: dict[str, int], copies: bool) -> dict[str, tuple[int, int]]:
    """Phase -> (start event, end event); compute only for a batch copied on the host (copies=False)."""
    pairs = {"compute": (events["exec_start"], events["exec_end"])}
    if copies:
        pairs.update(h2d=(events["h2d_start"], events["h2d_end"]), d2h=(events["d2h_start"], events["d2h_end"]))
    return pairs


def phase_timings(acl, events: dict[str, int], copies: bool) -> DeviceTimings:
    """Milliseconds per phase. Read only after the batch's last event was synchronized (every
    event of the slot is then complete). Raises AclError where the device will not time a pair
    (107006 not completed, 107007 reversed, as newer chips report completions lazily)."""
    rt = acl.rt
    ms = {phase: check("rt.event_elapsed_time", rt.event_elapsed_time(start, end))
          for phase, (start, end) in phase_events(events, copies).items()}
    return DeviceTimings(h2d_ms=ms.get("h2d", 0.0), compute_ms=ms["compute"], d2h_ms=ms.get("d2h", 0.0))
