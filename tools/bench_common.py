#!/usr/bin/env python3
"""Helpers of the benchmarks in tools/: the example models, raw ONNX Runtime sessions and timing,
request bodies, the wrk runner, child processes and HTTP, and the trivial HTTP endpoint that
measures the load generator's ceiling.

`python tools/bench_common.py trivial-server [--port 0]` runs the trivial endpoint in the
foreground: it prints the bound port on one stdout line, then answers every HTTP/1.1 request
(any method, any path, keep-alive, Content-Length bodies) with one fixed 200 JSON body until
SIGTERM/SIGINT.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass

import numpy as np

from bench_run import BenchFailed, sigterm_as_interrupt

# ONNX Runtime reads it when first imported (raw runs import it before any aclserve module,
# which sets the same: aclserve/__init__.py); ORT_DISABLE_TELEMETRY=0 keeps telemetry on
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

TOOLS = os.path.dirname(os.path.abspath(__file__))
MODEL_NAMES = ("light", "medium", "heavy")


# -- models and raw ONNX Runtime -------------------------------------------------------------------
def ensure_example_models(outdir: str) -> dict[str, str]:
    """Build the benchmark models (tools/make_example_models.py) into `outdir` unless they are
    there; name -> absolute ONNX path. A relative `outdir` is the caller's: the builder, and the
    compiles and servers of the tools, run in the repository's root."""
    outdir = os.path.abspath(outdir)
    paths = {m: os.path.join(outdir, f"{m}.onnx") for m in MODEL_NAMES}
    if not all(os.path.exists(p) for p in paths.values()):
        subprocess.run([sys.executable, os.path.join(TOOLS, "make_example_models.py"), outdir, "--skip-digits"],
                       check=True, cwd=os.path.dirname(TOOLS))
    return paths


def ensure_model(name: str) -> str:
    """The ONNX path of example model `name` in out/models/, built there if missing."""
    return ensure_example_models(os.path.join(os.path.dirname(TOOLS), "out", "models"))[name]


def raw_session(onnx_path: str, threads: int):
    """An InferenceSession with the settings the CPU runtime uses (the raw baseline)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    return ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])


# -- request bodies (KServe v2) ------------------------------------------------------------------
HEADER_LENGTH = "Inference-Header-Content-Length"


def sample_for(shape: list[int], seed: int = 0) -> np.ndarray:
    """One sample [1, ...] rounded to 4 decimals, so its JSON text is short and exact in float32."""
    x = np.random.default_rng(seed).standard_normal([1, *shape])
    return np.round(x, 4).astype(np.float32)  # float32 nearest to the 4-decimal text json_body writes


def json_body(sample: np.ndarray, input_name: str) -> bytes:
    flat = [round(float(v), 4) for v in sample.ravel()]
    doc = {"inputs": [{"name": input_name, "shape": list(sample.shape), "datatype": "FP32", "data": flat}]}
    return json.dumps(doc, separators=(",", ":")).encode()


def binary_body(sample: np.ndarray, input_name: str, output_name: str) -> tuple[bytes, int]:
    """Binary tensor extension body (input raw little-endian FP32, output asked as JSON) and
    the length of its JSON header."""
    raw = np.ascontiguousarray(sample, dtype="<f4").tobytes()
    head = {"inputs": [{"name": input_name, "shape": list(sample.shape), "datatype": "FP32",
                        "parameters": {"binary_data_size": len(raw)}}],
            "outputs": [{"name": output_name, "parameters": {"binary_data": False}}]}
    h = json.dumps(head, separators=(",", ":")).encode()
    return h + raw, len(h)


def decode_output(raw: bytes, output_name: str) -> np.ndarray:
    doc = json.loads(raw)
    out = next(o for o in doc["outputs"] if o["name"] == output_name)
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


# -- wrk -------------------------------------------------------------------------------------------
# Environment variables, not script args: wrk's done() runs in a Lua state that never sees
# init(args). wrk's own `status` error counts responses >= 400. With count_non2xx, a response()
# hook counts every status outside 2xx exactly (read back in done() through setup()'s thread
# handle), but a Lua response() hook makes wrk parse every response: it cuts wrk's ceiling ~3x.
WRK_LUA = r"""
local f = assert(io.open(os.getenv("WRK_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = os.getenv("WRK_CTYPE") or "application/json"
local xh = os.getenv("WRK_HEADER")
if xh and xh ~= "" then
  local k, v = xh:match("^([^:]+):%s*(.*)$")
  wrk.headers[k] = v
end

local threads = {}
function setup(thread) table.insert(threads, thread) end
non2xx = -1  -- -1: not counted
--RESPONSE_HOOK--

function done(summary, latency, requests)
  local bad = 0
  for _, t in ipairs(threads) do bad = bad + (t:get("non2xx") or 0) end
  local e = summary.errors
  local o = assert(io.open(os.getenv("WRK_OUT"), "w"))
  o:write(string.format(
    '{"requests":%d,"duration_us":%d,"bytes":%d,"non2xx":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"min":%d,"mean":%.1f,"max":%d,"p50":%d,"p90":%d,"p99":%d}}\n',
    summary.requests, summary.duration, summary.bytes, bad,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.mean, latency.max,
    latency:percentile(50), latency:percentile(90), latency:percentile(99)))
  o:close()
end
"""
RESPONSE_HOOK = """non2xx = 0
function response(status, headers, body)
  if status < 200 or status > 299 then non2xx = non2xx + 1 end
end"""


@dataclass
class Body:
    """One request body posted by wrk, with its content type and optional extra header."""
    data: bytes
    content_type: str
    extra_header: str = ""  # "Name: value"


class Wrk:
    """Runs wrk -t1 pinned with taskset; owns a temp folder (script, bodies, results), close()
    removes it (idempotent). run() blocks for the run's duration; a KeyboardInterrupt kills wrk
    (subprocess.run does). A result's "non2xx" is -1 unless count_non2xx."""

    def __init__(self, cpus: str, timeout_s: float = 30.0, count_non2xx: bool = False):
        self.cpus, self.timeout_s = cpus, timeout_s
        self._dir = tempfile.TemporaryDirectory(prefix="bench-wrk-")
        self.script = os.path.join(self._dir.name, "post.lua")
        with open(self.script, "w") as f:
            f.write(WRK_LUA.replace("--RESPONSE_HOOK--", RESPONSE_HOOK if count_non2xx else ""))
        self._n = 0

    def run(self, url: str, body: Body, connections: int, seconds: float) -> dict:
        self._n += 1
        body_path = os.path.join(self._dir.name, f"body{self._n}")
        out_path = os.path.join(self._dir.name, f"out{self._n}.json")
        with open(body_path, "wb") as f:
            f.write(body.data)
        env = dict(os.environ, WRK_BODY=body_path, WRK_CTYPE=body.content_type,
                   WRK_HEADER=body.extra_header, WRK_OUT=out_path)
        # wrk takes whole seconds only: a fractional --duration or --warmup is rounded up
        cmd = ["taskset", "-c", self.cpus, "wrk", "-t1", f"-c{connections}", f"-d{max(1, math.ceil(seconds))}s",
               "--timeout", f"{self.timeout_s:g}s", "-s", self.script, url]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.exists(out_path):
            raise BenchFailed(f"wrk failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
        with open(out_path) as f:
            result = json.load(f)
        e = result["errors"]
        result["socket_errors"] = e["connect"] + e["read"] + e["write"] + e["timeout"]
        result["rps"] = result["requests"] / (result["duration_us"] / 1e6)
        return result

    def close(self) -> None:
        self._dir.cleanup()


# -- raw ONNX Runtime --------------------------------------------------------------------------------

class RawOrt:
    """InferenceSession.run on the source ONNX with the server's session options, timed on the
    given CPUs (this process's affinity is set for the measurement and restored). Caches the
    median seconds per batch size, so each size is measured once per run of the tool."""

    def __init__(self, onnx_path: str, threads: int, cpus: set[int], min_s: float = 0.5, min_runs: int = 20):
        self.session = raw_session(onnx_path, threads)
        self.input = self.session.get_inputs()[0]
        self.output_name = self.session.get_outputs()[0].name
        self.sample_shape = [int(d) for d in self.input.shape[1:]]
        self.cpus, self.min_s, self.min_runs = cpus, min_s, min_runs
        self._median: dict[int, float] = {}

    def infer(self, x: np.ndarray) -> np.ndarray:
        return self.session.run([self.output_name], {self.input.name: x})[0]

    def seconds_per_batch(self, batch: int) -> float:
        """Median time of one run at `batch`, over >= min_s seconds and >= min_runs runs."""
        if batch not in self._median:
            x = np.random.default_rng(batch).standard_normal([batch, *self.sample_shape]).astype(np.float32)
            feed = {self.input.name: x}
            saved = os.sched_getaffinity(0)
            os.sched_setaffinity(0, self.cpus)
            try:
                self.session.run(None, feed)  # warm-up
                times, start = [], time.perf_counter()
                while len(times) < self.min_runs or time.perf_counter() - start < self.min_s:
                    t0 = time.perf_counter()
                    self.session.run(None, feed)
                    times.append(time.perf_counter() - t0)
            finally:
                os.sched_setaffinity(0, saved)
            self._median[batch] = float(np.median(times))
        return self._median[batch]

    def samples_per_s_at_mix(self, mix: dict[int, int]) -> float:
        """Total samples / total raw time for `mix` (batch size -> executions)."""
        samples = sum(b * n for b, n in mix.items())
        seconds = sum(self.seconds_per_batch(b) * n for b, n in mix.items())
        return samples / seconds if seconds else 0.0


# -- processes and HTTP ------------------------------------------------------------------------------

class ManagedProcess:
    """A child process in its own session (a terminal Ctrl-C reaches only this tool, which then
    stops it; and so does a SIGTERM from now on: bench_run.sigterm_as_interrupt). Owns the process
    and its log file; close() sends SIGTERM, waits, kills after `grace_s`; idempotent."""

    def __init__(self, cmd: list[str], log_path: str, grace_s: float = 30.0, **kwargs):
        sigterm_as_interrupt()  # else a SIGTERM to the tool left this process running (its own session)
        self.log_path, self.grace_s = log_path, grace_s
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=kwargs.pop("stdout", self._log), stderr=self._log,
                                     start_new_session=True, **kwargs)

    def log_tail(self, lines: int = 20) -> str:
        with open(self.log_path, "rb") as f:
            return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")

    def close(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        if not self._log.closed:
            self._log.close()
        return self.proc.returncode


def keep_if_failed(folder: str, failed: bool) -> str:
    """Remove the run's folder (tempfile.mkdtemp: its server log, copies of models) unless the
    run failed (each run left one in /tmp); what to print."""
    if failed:
        return f"log kept: {folder}/server.log"
    shutil.rmtree(folder, ignore_errors=True)
    return "log removed (the run passed)"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid`, all its threads (live and exited), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after "(comm)": field 3 (state) is fields[0]
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # fields 14, 15: utime, stime


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, body: bytes | None = None, headers: dict | None = None, timeout: float = 60) -> bytes:
    req = urllib.request.Request(url, data=body, headers=headers or {}, method="POST" if body else "GET")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read()


def wait_ready(server: ManagedProcess, base: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise BenchFailed(f"server exited with {server.proc.returncode}:\n{server.log_tail()}")
        try:
            if json.loads(http(base + "/v2/health/ready", timeout=2)).get("ready"):
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise BenchFailed(f"server not ready after {timeout_s:g} s:\n{server.log_tail()}")


def cpu_set(taskset_list: str) -> set[int]:
    cpus = set()
    for part in taskset_list.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


# -- the trivial endpoint -------------------------------------------------------------------------

TRIVIAL_BODY = (b'{"model_name":"trivial","outputs":[{"name":"y","shape":[1,10],"datatype":"FP32",'
                b'"data":[0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0]}]}')
TRIVIAL_RESPONSE = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                    + str(len(TRIVIAL_BODY)).encode() + b"\r\n\r\n" + TRIVIAL_BODY)


class TrivialProtocol(asyncio.Protocol):
    """Minimal HTTP/1.1 keep-alive server: skips each request's headers and Content-Length body
    and answers the fixed response; no chunked bodies (wrk never sends them)."""

    def connection_made(self, transport):
        self.transport, self.buf, self.need = transport, bytearray(), -1

    def data_received(self, data):
        self.buf += data
        while True:
            if self.need < 0:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                length = 0
                for line in bytes(self.buf[:end]).split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                del self.buf[:end + 4]
                self.need = length
            if len(self.buf) < self.need:
                return
            del self.buf[:self.need]
            self.need = -1
            self.transport.write(TRIVIAL_RESPONSE)


async def _until_signalled() -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def _serve_trivial(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(TrivialProtocol, "127.0.0.1", port, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    await _until_signalled()
    server.close()
    await server.wait_closed()


async def _serve_aiohttp_floor(port: int) -> None:
    """The least an aiohttp server does per request: route, read the whole body, answer the
    fixed JSON response; no middlewares, no access log. What aclserve's HTTP front end costs
    on top of its own work is bounded below by this."""
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=TRIVIAL_BODY, content_type="application/json")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v2/models/{name}/infer", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=1024)
    await site.start()
    print(runner.addresses[0][1], flush=True)
    await _until_signalled()
    await runner.cleanup()


ENDPOINTS = {"trivial-server": _serve_trivial, "aiohttp-floor": _serve_aiohttp_floor}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, helptext in (("trivial-server", "run the trivial fixed-200 HTTP endpoint (raw asyncio)"),
                           ("aiohttp-floor", "run the same fixed answer from a bare aiohttp app")):
        sub.add_parser(name, help=helptext).add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(ENDPOINTS[args.cmd](args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
