"""wrk as the benchmarks' HTTP load generator: the Lua script that posts one body and writes the
run's figures as JSON, the body it posts, and the runner that owns wrk's temp folder."""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from bench_run import BenchFailed

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


def require_wrk() -> None:
    """Raise BenchFailed, saying how to get them, unless wrk and taskset (which pins it) are on PATH;
    the tools that drive wrk call it before they build or start anything (without wrk, bench_server
    ended "[Errno 2] No such file or directory: 'wrk'", the others "wrk failed (127): taskset: failed
    to execute wrk" once their server had started)."""
    missing = {name: package for name, package in (("wrk", "wrk"), ("taskset", "util-linux")) if not shutil.which(name)}
    if missing:
        are = "is" if len(missing) == 1 else "are"
        raise BenchFailed(f"{' and '.join(missing)} {are} not on PATH: this tool drives wrk, pinned with taskset "
                          f"(apt-get install {' '.join(missing.values())}; README \"Performance\")")


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
