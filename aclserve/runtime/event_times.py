"""A batch's phase times from its slot's events: H2D, compute and D2H, as the device measured them."""
from __future__ import annotations

from ..acl import check
from .types import DeviceTimings


def phase_events(events: dict[str, int], direct: bool) -> dict[str, tuple[int, int]]:
    """Phase -> (start event, end event), both recorded on one stream (phase_stream). A direct
    batch (enqueue.direct: all on the compute stream, in order) times its copies by the events
    around them."""
    if direct:
        return {"h2d": (events["h2d_start"], events["exec_start"]),
                "compute": (events["exec_start"], events["exec_end"]),
                "d2h": (events["exec_end"], events["d2h_end"])}
    return {"h2d": (events["h2d_start"], events["h2d_end"]),
            "compute": (events["exec_start"], events["exec_end"]),
            "d2h": (events["d2h_start"], events["d2h_end"])}


def phase_stream(phase: str, direct: bool) -> str:
    """The stream role ("h2d", "compute", "d2h") whose events time `phase`: a direct batch's all
    ran on its compute stream; a piped batch's each on the stream of its name."""
    return "compute" if direct else phase


def phase_timings(acl, events: dict[str, int], direct: bool) -> DeviceTimings:
    """Milliseconds per phase. Read only after the batch's last event was synchronized (every
    event of the slot is then complete). Raises AclError where the device will not time a pair
    (107006 not completed, 107007 reversed, as newer chips report completions lazily)."""
    rt = acl.rt
    ms = {phase: check("rt.event_elapsed_time", rt.event_elapsed_time(start, end))
          for phase, (start, end) in phase_events(events, direct).items()}
    return DeviceTimings(h2d_ms=ms["h2d"], compute_ms=ms["compute"], d2h_ms=ms["d2h"])
