#!/usr/bin/env python3
"""Sidecar for the peers benchmark: mirror a model's executed batch sizes into a JSON file.

The shared peers harness (shared/peers-bench) reads `$BATCH_STATS_FILE`, a cumulative
histogram {"batches": N, "hist": {"<size>": count}}, to compare each server with raw ONNX
Runtime running the same batch-size mix. This polls aclserve's statistics extension
(`GET /v2/models/{model}/stats`, whose batch_stats count real rows per execution, padding
excluded) every `--period` seconds, writes the file atomically, and exits once the server
has gone away.

    python tools/batch_stats_writer.py http://127.0.0.1:8000 medium /tmp/medium.batches.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request

from bench_args import positive_float  # (tools/, beside this file)


def snapshot(url: str, model: str) -> dict:
    with urllib.request.urlopen(f"{url}/v2/models/{model}/stats", timeout=5) as r:
        stats = json.load(r)["model_stats"]
    hist: dict[str, int] = {}
    for version in stats:
        for b in version.get("batch_stats", []):
            key = str(b["batch_size"])
            hist[key] = hist.get(key, 0) + int(b["compute_infer"]["count"])
    return {"batches": sum(hist.values()), "hist": dict(sorted(hist.items(), key=lambda kv: int(kv[0])))}


def write(path: str, snap: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(dict(snap, pid=os.getpid(), t=time.time()), f)
    os.replace(tmp, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url", help="the server, as http://127.0.0.1:8000")
    ap.add_argument("model", help="the model whose batches are mirrored")
    ap.add_argument("path", help="the JSON file written ('' for none: exits at once)")
    ap.add_argument("--period", type=positive_float, default=0.2, help="seconds between polls (default %(default)g)")
    ap.add_argument("--startup-timeout", type=positive_float, default=300.0,
                    help="seconds to wait for the server's first answer (default %(default)g)")
    args = ap.parse_args()
    if not args.path:
        return 0
    started, connected, failures, last = time.monotonic(), False, 0, None
    while True:
        try:
            snap = snapshot(args.url, args.model)
        except (OSError, urllib.error.URLError, ValueError, KeyError):
            failures += 1
            if (connected and failures >= 10) or time.monotonic() - started > args.startup_timeout and not connected:
                return 0
        else:
            connected, failures = True, 0
            if snap != last:
                write(args.path, snap)
                last = snap
        time.sleep(args.period)


if __name__ == "__main__":
    sys.exit(main())
