"""Soak and chaos run: a real `aclserve serve` under mixed load for minutes, with hot reloads,
injected device faults, slow clients and decompression bombs, checking every answer.

    python tools/soak.py                      # 10 minutes (about 2 minutes: --minutes 2)

What runs at the same time, against one server on 127.0.0.1:
- `--clients` closed-loop good clients sending 1-8 digit rows as KServe v2 JSON or binary bodies;
  each 200 is decoded and compared with ONNX Runtime on the source model;
- a reloader swapping the model file (two compiles with different gears) every `--reload-s` s;
- device faults injected by the CPU runtime (ACLSERVE_CPU_FAULTS, `--fault-probability`, with a
  code of the soak's own: soak_tally.INJECTED_CODE);
- slow clients that send headers a byte at a time and stall mid-body;
- gzip bombs (1 MiB that inflates to 1 GiB) and large JSON bodies, on connections of their own.
At the end it prints requests answered, errors by status (503s by the reason their answer gives),
the good clients' latency p50/p99/max (a timeout counted at `--timeout-s`), answers checked and
wrong, the bombs' answers, what became of the swaps (soak_swaps.py), and the server's RSS at the
start, the end (the last seen, if it died) and the peak. A server that dies ends the run at once;
a good client whose request got no answer waits 0.05 s, doubled after each one more, up to 1 s.
Exit status 1 on any of the failures soak_tally.Tally.failures and soak_swaps.Swaps.report list
(README "Soak and chaos run"). Ctrl-C or SIGTERM stop the server and remove the run's folder, exit
130 (tools/bench_run.py). Not part of the test suite.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import time
import zlib

import numpy as np

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TOOLS)
sys.path.insert(0, TOOLS)

from bench_args import (at_least, fraction, non_negative_float, non_negative_int, positive_float,  # noqa: E402
                        positive_int)
from bench_common import free_port, keep_if_failed  # noqa: E402
from bench_run import run_async, run_folder, run_tool  # noqa: E402
from soak_swaps import Swaps, write_swap  # noqa: E402
from soak_tally import Tally, fault_spec, injected  # noqa: E402

# ONNX Runtime reads it when first imported: the reference session loads it before any aclserve
# module, which sets the same (aclserve/__init__.py); ORT_DISABLE_TELEMETRY=0 keeps telemetry on
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")


def _gzip_bomb(inflated: int) -> bytes:
    """A gzip body of about 1 MiB per GiB that inflates to `inflated` bytes of a JSON array."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: gzip framing
    chunk = b"0," * (1 << 19)
    parts = [z.compress(b"[")]
    for _ in range(inflated // len(chunk)):
        parts.append(z.compress(chunk))
    parts.append(z.compress(b"0]"))
    parts.append(z.flush())
    return b"".join(parts)


def _rss_mb(pid: int) -> float | None:
    """Its RSS; None once it is gone (a dead process not reaped yet has no VmRSS line)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


class Soak:
    def __init__(self, args):
        self.args = args
        self.tally = Tally()
        self.rss: list[tuple[float, float]] = []  # (seconds into the run, MB) while the server lived
        self.window_end = 0.0  # (time.monotonic) when the load stops
        self.ended = asyncio.Event()  # set when the server died: every part of the load stops at once
        self.died_at: float | None = None  # seconds into the run
        self.proc: subprocess.Popen | None = None
        self.folder = ""  # the run's (its server's log, the models): kept when the run failed
        self.swaps: Swaps | None = None
        self.max_batch: list[int] = []  # each variant's largest batch (what the server's config says)
        data = np.load(os.path.join(ROOT, "tests", "data", "digits_test.npz"))
        self.x = data["x"].astype(np.float32)
        import onnxruntime as ort
        self.reference = ort.InferenceSession(os.path.join(ROOT, "models", "digits.onnx"),
                                              providers=["CPUExecutionProvider"])

    # -- set-up ----------------------------------------------------------------------------
    def prepare(self, folder: str) -> tuple[str, list[bytes]]:
        from aclserve.om.compile import compile_model
        models = os.path.join(folder, "models")
        os.mkdir(models)
        variants = []
        for i, gears in enumerate(("1,2,4,8", "1,2,4,8,16,32")):
            self.max_batch.append(max(map(int, gears.split(","))))
            out = os.path.join(folder, f"v{i}.om")
            compile_model(os.path.join(ROOT, "models", "digits.onnx"), out, batch=gears, target="cpu",
                          log=lambda _: None)
            with open(out, "rb") as f:
                variants.append(f.read())
        shutil.copy(os.path.join(folder, "v0.om"), os.path.join(models, "digits.om"))
        # a queue of a request for each client, so that the soak's own load never fills it: the auto queue
        # of the gears 1-8 holds 64 rows, which 16 clients of 1-8 rows each overran on a slow machine, 503s
        # that were taken for rebuilds (an independent tester: 321 x 503 "queue is full" with no faults)
        with open(os.path.join(models, "digits.yaml"), "w") as f:
            f.write(f"batching: {{default_queue_policy: {{max_queue_size: {self.args.clients}}}}}\n")
        return models, variants

    def start(self, models: str, port: int) -> subprocess.Popen:
        env = dict(os.environ, ACLSERVE_CPU_FAULTS=fault_spec(self.args.fault_probability))
        cmd = [sys.executable, "-m", "aclserve", "serve", "--models", models, "--port", str(port),
               "--grpc-port", "0", "--log-level", "warning"]
        with open(os.path.join(os.path.dirname(models), "server.log"), "w") as log:  # (the child keeps its own)
            return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)

    # -- load ------------------------------------------------------------------------------
    def running(self) -> bool:
        return not self.ended.is_set() and time.monotonic() < self.window_end

    async def pause(self, seconds: float) -> None:
        """Sleep `seconds`, less when the window ends or the server dies first."""
        left = min(seconds, self.window_end - time.monotonic())
        if left > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.ended.wait(), left)

    async def client(self, session, url: str, seed: int) -> None:
        rng = random.Random(seed)
        backoff = 0.0
        while self.running():
            n = rng.randint(1, 8)
            start = rng.randrange(0, len(self.x) - n)
            status = await self.ask(session, url, self.x[start:start + n], binary=rng.random() < 0.5)
            # no answer: wait longer each time (up to 1 s), so that a server gone is not asked in a busy loop
            backoff = 0.0 if status is not None else min(1.0, 2 * backoff or 0.05)
            if backoff or status == 503:
                await self.pause(backoff or 0.05)

    async def ask(self, session, url: str, rows: np.ndarray, binary: bool) -> int | None:
        """One request of a good client, its outcome counted (a 200 checked); its status (None: no answer)."""
        t0 = time.perf_counter()
        try:
            status, header_length, raw = await self._post(session, url, rows, binary)
        except asyncio.TimeoutError:  # a stall, counted at its timeout (aiohttp's; the builtin's alias from 3.11)
            self.tally.timed_out(self.args.timeout_s)
            return None
        except Exception as e:  # connection refused or reset: no answer, a failure of the run
            self.tally.client_error(e)
            return None
        if status == 500 and injected(raw):
            self.tally.status["500 device fault (injected)"] += 1
            return status
        self.tally.status[status] += 1
        if status == 503:
            self.tally.unavailable_answer(raw)
        elif status == 200:  # (decoded outside the try: an answer that does not decode is a wrong one)
            self.tally.latency.append(time.perf_counter() - t0)
            self.tally.check(self.reference.run(["y"], {"x": rows})[0], header_length, raw)
        return status

    async def _post(self, session, url: str, rows: np.ndarray, binary: bool) -> tuple[int, str | None, bytes]:
        """(status, Inference-Header-Content-Length, body) of one inference request."""
        spec = {"name": "x", "shape": list(rows.shape), "datatype": "FP32"}
        if binary:
            header = json.dumps({"inputs": [dict(spec, parameters={"binary_data_size": rows.nbytes})],
                                 "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()
            body = header + rows.tobytes()
            headers = {"Inference-Header-Content-Length": str(len(header)),
                       "Content-Type": "application/octet-stream"}
        else:
            body = json.dumps({"inputs": [dict(spec, data=rows.ravel().tolist())]}).encode()
            headers = {"Content-Type": "application/json"}
        async with session.post(url, data=body, headers=headers) as r:
            return r.status, r.headers.get("Inference-Header-Content-Length"), await r.read()

    async def reloader(self, models: str, variants: list[bytes]) -> None:
        i = 0
        while self.running():
            await self.pause(self.args.reload_s)
            if not self.running():
                break
            i += 1
            write_swap(models, variants[i % 2])
            self.swaps.wrote(i % 2)

    async def slow_client(self, port: int) -> None:
        while self.running():
            writer = None
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                request = b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{"
                for byte in request:
                    if not self.running():
                        break
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await self.pause(0.2)
                await self.pause(5)  # stall mid-body
                self.tally.tool["slow clients done"] += 1
            except (ConnectionError, OSError):
                self.tally.tool["slow clients cut off"] += 1
                await self.pause(0.5)
            finally:
                if writer is not None:
                    writer.close()  # (a client cut off too: its socket is not left to the collector)

    @staticmethod
    def bomb_bodies(inflated: int = 1 << 30) -> list[tuple[str, bytes, dict]]:
        """The bombs' bodies (the gzip one inflating to `inflated` bytes), built before the measured
        window: building them takes seconds of CPU (the gzip bomb 7-15 s), which on the clients'
        event loop stalled every good client."""
        bomb = _gzip_bomb(inflated)
        big = json.dumps({"inputs": [{"name": "x", "shape": [40000, 64], "datatype": "FP32",
                                      "data": [0.5] * (40000 * 64)}]}).encode()
        return [("gzip bomb", bomb, {"Content-Encoding": "gzip", "Content-Type": "application/json"}),
                ("large json", big, {"Content-Type": "application/json"})]

    async def bombs(self, session, url: str, kinds: list[tuple[str, bytes, dict]]) -> None:
        while self.running():
            await self.bomb_round(session, url, kinds)
            await self.pause(self.args.bomb_s)

    async def bomb_round(self, session, url: str, kinds: list[tuple[str, bytes, dict]]) -> None:
        """Each bomb once; what it got (a status, or the exception of a request with no answer) counted."""
        for kind, body, headers in kinds:
            try:
                # (a file object: aiohttp sends it a chunk at a time, where raw bytes of MBs hold the loop)
                async with session.post(url, data=io.BytesIO(body), headers=headers) as r:
                    await r.read()
                    self.tally.bombs[kind, r.status] += 1
            except Exception as e:
                self.tally.bombs[kind, type(e).__name__] += 1

    async def watch_server(self, proc: subprocess.Popen, t0: float) -> None:
        """Sample its RSS every 0.25 s; once it died, end the run (`ended`) instead of loading a dead port."""
        while self.running():
            if proc.poll() is not None:
                self.died_at = time.monotonic() - t0
                self.ended.set()
                return
            rss = _rss_mb(proc.pid)
            if rss is not None:
                self.rss.append((time.monotonic() - t0, rss))
            await self.pause(0.25)

    def execute(self) -> int:
        """The run; its exit status. Its models and the bombs' bodies are made before the event loop
        runs (seconds of CPU a Ctrl-C or SIGTERM ends at once: run_async's loop takes a signal only
        as it polls). Interrupted (its server stopped) or ended by an error, it removes its folder;
        a run that ends keeps it when it failed (report)."""
        with run_folder("aclserve-soak-") as folder:
            self.folder = folder
            models, variants = self.prepare(folder)
            bomb_kinds = self.bomb_bodies() if self.args.bombs else []
            return run_async(self.run(models, variants, bomb_kinds))

    async def run(self, models: str, variants: list[bytes], bomb_kinds: list[tuple[str, bytes, dict]]) -> int:
        import aiohttp
        folder = self.folder
        port = free_port()
        proc = self.proc = self.start(models, port)
        base = f"http://127.0.0.1:{port}"
        url = f"{base}/v2/models/digits/infer"
        try:
            timeout = aiohttp.ClientTimeout(total=self.args.timeout_s)
            # the good clients' connections are their own (the bombs' session has others: a connection
            # the server closes behind a 413 is never one a good client takes next), and go idle
            # for 5 s at most, well within the server's keepalive_timeout_s (15 s): a good client
            # never sends on a connection the server is closing as idle
            async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(keepalive_timeout=5)) \
                    as session, aiohttp.ClientSession(timeout=timeout) as bomb_session:
                for _ in range(300):
                    if proc.poll() is not None:
                        break
                    try:
                        async with session.get(f"{base}/v2/health/ready") as r:
                            if r.status == 200:
                                break
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.1)
                self.swaps = Swaps(os.path.join(folder, "server.log"))
                # (a server gone: the watch ends the run)
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                    await self.swaps.start(session, base)
                t0 = time.monotonic()
                self.window_end = t0 + self.args.minutes * 60
                jobs = [self.client(session, url, seed) for seed in range(self.args.clients)]
                jobs += [self.reloader(models, variants), self.watch_server(proc, t0)]
                if self.args.bombs:
                    jobs.append(self.bombs(bomb_session, url, bomb_kinds))
                jobs += [self.slow_client(port) for _ in range(self.args.slow)]
                await asyncio.gather(*jobs)
                # (a server gone: swaps not counted)
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                    await self.swaps.settle(session, base, self.max_batch[self.swaps.last],
                                            alive=lambda: proc.poll() is None)
        finally:
            alive = proc.poll() is None
            proc.terminate()
            proc.wait(60)
        return self.report(alive, folder)

    def report(self, alive: bool, folder: str) -> int:
        """Print what the run saw and why it failed; its exit status."""
        print(f"soak: {self.args.minutes:g} min, {self.args.clients} clients, {self.args.slow} slow clients, "
              f"fault probability {self.args.fault_probability}, reload every {self.args.reload_s:g} s")
        failures = self.tally.print_report(alive)
        if self.swaps is not None:
            failures += self.swaps.report()
        if self.rss:
            peak = max(r for _, r in self.rss)
            end = "end" if alive else f"last seen {self.rss[-1][0]:.1f} s into the run"
            print(f"server RSS: start {self.rss[0][1]:.0f} MB, {end} {self.rss[-1][1]:.0f} MB, peak {peak:.0f} MB")
        if self.died_at is not None:
            print(f"the server died {self.died_at:.1f} s into the run: the run stopped there")
        for failure in failures:
            print(f"FAILED: {failure}")
        print(f"server {'alive when the run ended' if alive else 'DIED'}; {keep_if_failed(folder, bool(failures))}")
        return 1 if failures else 0


def main() -> int:
    args = parse_args()
    return run_tool("soak", lambda: Soak(args).execute())


# the shortest time between swaps: below it the swaps outrun the server (a file event is debounced 0.25 s,
# debounce_s, and the model then loaded and warmed up), each superseding the one before it loaded (an
# independent tester: --reload-s 0 wrote 25,725 swaps in 6 s, 16 requests were answered, and the run passed)
MIN_RELOAD_S = 1.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + " A default run takes 10 minutes of load, "
                                 "and half a minute or so more to set up and check the end.")
    ap.add_argument("--minutes", type=positive_float, default=10.0, help="length of the load (default %(default)g)")
    ap.add_argument("--clients", type=positive_int, default=16,
                    help="good clients, and the model's queue in requests (default %(default)s)")
    ap.add_argument("--slow", type=non_negative_int, default=20,
                    help="slow clients: byte-at-a-time headers, stalled bodies (default %(default)s)")
    ap.add_argument("--reload-s", type=at_least(MIN_RELOAD_S, " s"), default=5.0,
                    help=f"seconds between model swaps, {MIN_RELOAD_S:g} or more: a swap is debounced and loaded "
                         "before the next can mean anything (default %(default)g)")
    ap.add_argument("--bomb-s", type=non_negative_float, default=10.0,
                    help="seconds between bomb rounds (default %(default)g)")
    ap.add_argument("--no-bombs", dest="bombs", action="store_false", help="leave out the bombs")
    ap.add_argument("--timeout-s", type=positive_float, default=30.0,
                    help="a request with no answer by then is a timeout (a stall), which fails the run "
                         "(default %(default)g)")
    ap.add_argument("--fault-probability", type=fraction, default=0.002,
                    help="share of executions that fail, 0 to 1 (default %(default)g)")
    return ap.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
