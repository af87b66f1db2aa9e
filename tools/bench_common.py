"""The benchmarks' servers as child processes, and plain HTTP to them: a managed child process (its
own session, its log, stopped on close), its readiness, its CPU time, a free port, one request,
and the run folder kept when the run failed."""
from __future__ import annotations

import json
import os
import signal
import shutil
import socket
import subprocess
import time
import urllib.request

from bench_run import BenchFailed, sigterm_as_interrupt


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
