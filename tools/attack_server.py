#!/usr/bin/env python3
"""Hostile clients against a real `aclserve serve`, with the server's RSS measured throughout.

Starts `aclserve serve` on the repository's models/ (the digits model) on a free loopback port
with the config given (--config, merged over the embedded default), then runs each attack in
turn while a prober sends one ordinary infer request every 0.2 s and /proc/<pid>/status is
sampled every 20 ms. For each attack it prints the RSS before, the peak during, the RSS 3 s
after, the status codes the attackers got, and how many probes were answered 200.

    python tools/attack_server.py [--attacks gzip,json,slowloris,idle] [--count 16]
        [--bomb-mb 1024] [--json-mb 40] [--conns 1000] [--hold-s 20] [--config FILE]

Attacks: gzip = --count concurrent gzip bodies that inflate to --bomb-mb MB of zeros;
json = --count concurrent --json-mb MB JSON bodies (one infer input of 0.5,0.5,...);
slowloris = --conns connections sending a request head one byte per second for --hold-s s;
idle = --conns connections that send nothing for --hold-s s. Loopback only; every loop is
bounded by --count/--conns and --hold-s.
A server that dies during an attack ends the run in one error line, exit status 1; Ctrl-C or
SIGTERM stop it and remove the run's folders, exit 130 (tools/bench_run.py).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import zlib

import aiohttp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_args import names_of, positive_float, positive_int  # noqa: E402
from bench_common import ManagedProcess, free_port, keep_if_failed, wait_ready  # noqa: E402
from bench_run import ensure_running, run_async, run_folder, run_tool  # noqa: E402
from peak_sampler import PeakSampler  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ATTACKS = ("gzip", "json", "slowloris", "idle")
PROBE = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}]}).encode()


class RssSampler(PeakSampler):
    """Samples VmRSS of `pid` every 20 ms in a thread; peak() since the last reset()."""

    def __init__(self, pid: int):
        self.pid = pid
        super().__init__(self.rss, 0.02)

    def rss(self) -> int:
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def reset(self, start=None) -> None:
        super().reset(self.rss() if start is None else start)


def gzip_bomb(megabytes: int) -> bytes:
    enc = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    return b"".join([*(enc.compress(block) for _ in range(megabytes)), enc.flush()])


def big_json(megabytes: int) -> bytes:
    count = megabytes * (1 << 20) // 4
    rows = max(1, count // 64)
    head = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[%d,64],"data":[' % rows
    return head + b"0.5," * (rows * 64 - 1) + b"0.5]}]}"


async def probe_loop(url: str, stop: asyncio.Event, results: list) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        while not stop.is_set():
            try:
                async with session.post(url, data=PROBE, headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    results.append(r.status)
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                results.append(type(e).__name__)
            await asyncio.sleep(0.2)


async def post_many(url: str, body: bytes, count: int, headers: dict) -> list:
    async def one(session):
        try:
            async with session.post(url, data=body, headers=headers) as r:
                await r.read()
                return r.status
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            return type(e).__name__
    connector = aiohttp.TCPConnector(limit=count, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as s:
        return await asyncio.gather(*(one(s) for _ in range(count)))


async def hold_connections(host: str, port: int, conns: int, hold_s: float, slow: bool) -> dict:
    """Open `conns` connections; slow: trickle a request head one byte per second. Returns how
    many the server closed before hold_s and how many could not connect."""
    head = b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n"
    outcome = {"closed_by_server": 0, "still_open": 0, "connect_failed": 0}

    async def one():
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            outcome["connect_failed"] += 1
            return
        deadline = time.monotonic() + hold_s
        try:
            i = 0
            while time.monotonic() < deadline:
                if slow and i < len(head):
                    writer.write(head[i:i + 1])
                    i += 1
                try:
                    data = await asyncio.wait_for(reader.read(65536), 1.0)
                except asyncio.TimeoutError:
                    continue
                if not data:
                    outcome["closed_by_server"] += 1
                    return
            outcome["still_open"] += 1
        except OSError:
            outcome["closed_by_server"] += 1
        finally:
            writer.close()
    await asyncio.gather(*(one() for _ in range(conns)))
    return outcome


async def run_attack(name: str, args, base: str, host: str, port: int, sampler: RssSampler) -> dict:
    url = base + "/v2/models/digits/infer"
    stop, probes = asyncio.Event(), []
    await asyncio.sleep(1.0)
    before = sampler.rss()
    sampler.reset()
    prober = asyncio.create_task(probe_loop(url, stop, probes))
    start = time.monotonic()
    if name == "gzip":
        body = gzip_bomb(args.bomb_mb)
        hdrs = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        outcome = await post_many(url, body, args.count, hdrs)
    elif name == "json":
        outcome = await post_many(url, big_json(args.json_mb), args.count, {"Content-Type": "application/json"})
    elif name in ("slowloris", "idle"):
        outcome = await hold_connections(host, port, args.conns, args.hold_s, slow=name == "slowloris")
    else:
        raise ValueError(f"unknown attack {name!r}")  # (parse_args took it: a bug)
    seconds = time.monotonic() - start
    await asyncio.sleep(3.0)
    stop.set()
    await prober
    if isinstance(outcome, list):
        labels = [str(k) for k in outcome]
        outcome = {k: labels.count(k) for k in sorted(set(labels))}
    return {"attack": name, "seconds": round(seconds, 1), "rss_before_mb": before / 2**20,
            "rss_peak_mb": sampler.peak() / 2**20, "rss_after_mb": sampler.rss() / 2**20,
            "attackers": outcome, "probes_ok": probes.count(200), "probes": len(probes),
            "probe_failures": sorted({str(p) for p in probes if p != 200})}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attacks", type=names_of(ATTACKS), default=",".join(ATTACKS),
                    help="comma-separated, run in turn (default %(default)s)")
    ap.add_argument("--count", type=positive_int, default=16,
                    help="concurrent bodies of the gzip and json attacks (default %(default)s)")
    ap.add_argument("--bomb-mb", type=positive_int, default=1024,
                    help="MB of zeros each gzip body inflates to (default %(default)s)")
    ap.add_argument("--json-mb", type=positive_int, default=40, help="MB of each JSON body (default %(default)s)")
    ap.add_argument("--conns", type=positive_int, default=1000,
                    help="connections of the slowloris and idle attacks (default %(default)s)")
    ap.add_argument("--hold-s", type=positive_float, default=20.0,
                    help="seconds the slowloris and idle connections are held (default %(default)g)")
    ap.add_argument("--config", help="server config file merged over the embedded default (default none)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    return run_tool("attack_server", lambda: run(args))


def run(args) -> int:
    port = free_port()
    cmd = [sys.executable, "-m", "aclserve", "serve", "--models", os.path.join(ROOT, "models"),
           "--port", str(port), "--grpc-port", "0", "--device", "cpu", "--model-control-mode", "none"]
    if args.config:  # (the server runs in the repository's root, not in the folder the path is relative to)
        cmd += ["--config", os.path.abspath(args.config)]
    with run_folder("aclserve-attack-") as folder:
        server = ManagedProcess(cmd, os.path.join(folder, "server.log"), cwd=ROOT)
        try:
            rows = attack_all(args, server, port)
        finally:
            code = server.close()
        print(f"server exit status {code}; {keep_if_failed(folder, code != 0)}")
    print("| attack | s | RSS before MB | RSS peak MB | RSS after MB | attackers | probes 200/sent |")
    print("|---|---:|---:|---:|---:|---|---:|")
    for r in rows:
        print(f"| {r['attack']} | {r['seconds']} | {r['rss_before_mb']:.0f} | {r['rss_peak_mb']:.0f} | "
              f"{r['rss_after_mb']:.0f} | {r['attackers']} | {r['probes_ok']}/{r['probes']} |")
    return 0


def attack_all(args, server: ManagedProcess, port: int) -> list[dict]:
    """Each attack of --attacks in turn, once the server is ready; a row each."""
    base = f"http://127.0.0.1:{port}"
    wait_ready(server, base, 120)
    sampler = RssSampler(server.proc.pid)
    rows = []
    try:
        for name in args.attacks:
            try:
                row = run_async(run_attack(name, args, base, "127.0.0.1", port, sampler))
            finally:  # a dead server's attack is refused connections, no measurement of it
                ensure_running(server, f"the {name} attack")
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        sampler.close()
    return rows


if __name__ == "__main__":
    sys.exit(main())
