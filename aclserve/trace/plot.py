"""A trace's timeline as a PNG (matplotlib, Agg): one row per track, one bar per span, for a
window of the run (a whole run's thousands of spans would be a smear). Needs matplotlib
(`pip install 'aclserve[plot]'`)."""
from __future__ import annotations

COLOURS = {"compute": "#d62728", "H2D": "#1f77b4", "D2H": "#17becf", "memcpy": "#1f77b4", "pack": "#ff7f0e",
           "unpack": "#ffbb78", "decode": "#2ca02c", "encode": "#98df8a", "queue": "#c7c7c7",
           "execute": "#9467bd", "batch": "#8c564b", "receive": "#bcbd22", "request": "#e7e7e7"}


def _colour(name: str) -> str:
    for key, colour in COLOURS.items():
        if name.startswith(key) or name.startswith(f"{key} "):
            return colour
    return "#7f7f7f"


def render_png(events: list[dict], path: str, window_ms: float = 20.0, start_us: float | None = None) -> int:
    """Draw `window_ms` of the trace from `start_us` (default: the middle of the run); returns the
    number of spans drawn."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        raise ValueError("the trace has no spans to draw")
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    if start_us is None:
        first, last = min(e["ts"] for e in spans), max(e["ts"] + e["dur"] for e in spans)
        start_us = max(first, (first + last) / 2 - window_ms * 500)
    end_us = start_us + window_ms * 1000
    shown = [e for e in spans if e["ts"] < end_us and e["ts"] + e["dur"] > start_us]
    tracks = sorted({(e["pid"], e["tid"]) for e in shown})
    row = {track: i for i, track in enumerate(tracks)}
    fig, ax = plt.subplots(figsize=(14, 0.35 * len(tracks) + 1.5))
    for e in shown:
        a = max(e["ts"], start_us)
        b = min(e["ts"] + e["dur"], end_us)
        depth = 0.8 if e["name"].startswith(("request", "batch #")) else 0.5
        y = row[(e["pid"], e["tid"])]
        ax.broken_barh([((a - start_us) / 1000, max((b - a) / 1000, 1e-4))], (y - depth / 2, depth),
                       facecolors=_colour(e["name"]), edgecolors="none")
    ax.set_yticks(range(len(tracks)))
    ax.set_yticklabels([f"{processes.get(p, p)}: {names.get((p, t), t)}"[-48:] for p, t in tracks], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_xlim(0, window_ms)
    ax.set_title(f"aclserve timeline, {window_ms:g} ms window")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    ax.legend(handles, COLOURS.keys(), fontsize=6, ncol=len(COLOURS), loc="upper center",
              bbox_to_anchor=(0.5, -0.08 - 1.0 / max(len(tracks), 4)))
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")  # the file named, as PNG (not name.png, nor a refused "name.txt")
    plt.close(fig)
    return len(shown)
