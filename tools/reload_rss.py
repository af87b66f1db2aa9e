"""Server memory over many hot reloads under load: does RSS come back, or grow with each reload?

Starts `aclserve serve` on a temporary models folder holding the medium CNN, keeps `--clients`
closed-loop JSON clients running, and replaces the model file `--reloads` times, alternating two
variants so every swap is a real reload. After each reload is serving (the server's
aclserve_model_reloads counter moved) it reads the server's RSS. `--kind onnx` drops .onnx files
instead, so every reload also goes through the compile cache.

    pip install -e '.[tools]'            # builds out/models/medium.onnx on first use
    python tools/reload_rss.py --reloads 100 --kind om
    python tools/reload_rss.py --reloads 20 --kind onnx

Prints the RSS after every reload and: after the first reload, the last, the highest, and the
last minus the first of the same variant (the two differ in size; from 3 reloads). Stopped by
Ctrl-C or SIGTERM, it stops its server and removes its folder (exit 130), as the benchmarks do.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.request

import onnx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from bench_args import positive_int  # noqa: E402
from bench_common import ManagedProcess, free_port, keep_if_failed, wait_ready  # noqa: E402
from bench_models import ensure_model  # noqa: E402
from bench_run import BenchFailed, ensure_running, run_folder, run_tool  # noqa: E402

BODY = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3, 64, 64],
                               "data": [0.5] * 12288}]}).encode()
SAME_VARIANT_RELOADS = 3  # the 1st and the 3rd reload load the same variant: fewer give no comparison


def variants(folder: str, kind: str) -> list[bytes]:
    """Two versions of the medium CNN: compiled with gears up to 8 and up to 16 (.om), or the
same graph under two producer names (.onnx; compiled by the server with its default gears)."""
    from aclserve.om.compile import compile_model
    source = ensure_model("medium")
    out = []
    for i, gears in enumerate(("1,2,4,8", "1,2,4,8,16")):
        if kind == "om":
            path = os.path.join(folder, f"v{i}.om")
            compile_model(source, path, batch=gears, target="cpu", log=lambda _: None)
        else:  # the same graph under another producer name: another file, another cache entry
            model = onnx.load(source)
            model.producer_name = f"reload-rss-{i}"
            path = os.path.join(folder, f"v{i}.onnx")
            onnx.save(model, path)
        with open(path, "rb") as f:
            out.append(f.read())
    return out


class Server:
    """`aclserve serve` on `models` (a bench_common.ManagedProcess: its own session, its log in
    `folder`, stopped by close()), and what this tool reads of it."""

    def __init__(self, models: str, folder: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = ManagedProcess(
            [sys.executable, "-m", "aclserve", "serve", "--models", models, "--port", str(self.port),
             "--grpc-port", "0", "--log-level", "warning"], os.path.join(folder, "server.log"), cwd=ROOT)

    def rss_mb(self) -> float:
        with open(f"/proc/{self.process.proc.pid}/status") as f:
            return int(f.read().split("VmRSS:")[1].split()[0]) / 1024

    def reloads(self) -> float:
        """The server's count of versions replaced while serving (/metrics)."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith('aclserve_model_reloads_total{model="medium"}'):
                    return float(line.split()[-1])
        return 0.0


def clients(url: str, count: int, stop: threading.Event, counts: dict, failures: list) -> list[threading.Thread]:
    """`count` closed-loop clients until `stop`: answers counted by outcome ("ok", an error's type
    and HTTP status), the first few failures' messages (with the time) kept in `failures`."""
    lock = threading.Lock()  # (`counts[key] += 1` of two threads at once may count one)

    def run():
        while not stop.is_set():
            req = urllib.request.Request(f"{url}/v2/models/medium/infer", data=BODY)
            try:
                urllib.request.urlopen(req, timeout=30).read()
                key, said = "ok", None
            except Exception as e:  # a reload must fail no request: count and show what did
                status = getattr(e, "code", None)
                key = type(e).__name__ + (f" {status}" if status else "")
                said = e.read()[:300].decode(errors="replace") if status else str(e)
            with lock:
                counts[key] = counts.get(key, 0) + 1
                if said is not None and len(failures) < 10:
                    failures.append(f"{time.strftime('%H:%M:%S')} {key}: {said}")
    threads = [threading.Thread(target=run, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    return threads


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reloads", type=positive_int, default=100,
                    help=f"the last minus the first of the same variant needs {SAME_VARIANT_RELOADS} or more")
    ap.add_argument("--kind", choices=("om", "onnx"), default="om")
    ap.add_argument("--clients", type=positive_int, default=4, help="closed-loop JSON clients during the run")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    return run_tool("reload_rss", lambda: run(args))


def run(args) -> int:
    counts, failures = {"ok": 0}, []
    with run_folder("reload-rss-") as folder:
        files = variants(folder, args.kind)
        models = os.path.join(folder, "models")
        os.mkdir(models)
        target = os.path.join(models, f"medium.{args.kind}")
        with open(target, "wb") as f:
            f.write(files[0])
        server = Server(models, folder)
        stop, threads = threading.Event(), []
        try:
            wait_ready(server.process, server.url, 120)
            threads = clients(server.url, args.clients, stop, counts, failures)
            rss = [server.rss_mb()]
            rss += [reload_once(server, target, files[i % 2], i) for i in range(1, args.reloads + 1)]
        finally:
            stop.set()  # the clients end before the server stops: no request fails by its stop
            for t in threads:
                t.join(60)
            code = server.process.close()
        print(f"server exit status {code}; {keep_if_failed(folder, code != 0)}")
    print(f"{args.reloads} .{args.kind} reloads, {args.clients} clients: answers {counts}")
    for failure in failures:
        print("  failed:", failure)
    print("RSS MB after start and each reload:", " ".join(f"{r:.0f}" for r in rss))
    last_odd = args.reloads - 1 + args.reloads % 2  # the last reload to the first one's variant
    same = (f"last of the same variant minus the first {rss[last_odd] - rss[1]:+.0f} MB"
            if args.reloads >= SAME_VARIANT_RELOADS
            else f"the same variant's change needs --reloads {SAME_VARIANT_RELOADS} or more")
    print(f"after the first reload {rss[1]:.0f} MB, last {rss[-1]:.0f} MB, highest {max(rss):.0f} MB, {same}")
    return 0 if set(counts) == {"ok"} and code == 0 else 1


def reload_once(server: Server, target: str, content: bytes, i: int) -> float:
    """Replace the model file with `content` (reload `i`); the server's RSS once it serves it."""
    part = target + ".part"
    with open(part, "wb") as f:
        f.write(content)
    os.replace(part, target)
    deadline = time.monotonic() + 120
    try:
        while server.reloads() < i:
            if time.monotonic() > deadline:
                raise BenchFailed(f"reload {i} did not come up in 120 s")
            time.sleep(0.05)
        time.sleep(0.5)  # a few batches on the new version
        return server.rss_mb()
    finally:  # a dead server is the failure to name, not the refused connection or the gone /proc it left
        ensure_running(server.process, f"reload {i}")


if __name__ == "__main__":
    sys.exit(main())
