#!/usr/bin/env python3
"""Slow gRPC senders against a real `aclserve serve`, with the server's RSS measured throughout.

Starts `aclserve serve` on the repository's models/ (the digits model) with its gRPC endpoint
on free loopback ports and the config given (--config, merged over the embedded default). Then
--senders raw HTTP/2 connections each open a call of --method (ModelInfer by default) and send
one --message-mb MB message (a ModelInferRequest whose raw input is that large) slowly: all but its last
--stall-kb KB paced over --send-s seconds (respecting the flow-control windows the server
grants, as a client must), then nothing more. Meanwhile a prober sends one ordinary gRPC infer
every 0.2 s and /proc/<pid>/status is sampled every 20 ms. Prints the RSS before, the peak
during and the RSS 3 s after, how the senders' calls ended (ended by the server with a status or
a reset, connection closed, still open after --hold-s), and how many probes were answered.

    python tools/grpc_slow_senders.py [--senders 64] [--message-mb 8] [--send-s 10]
        [--stall-kb 100] [--hold-s 90] [--method ModelInfer] [--config FILE] [--source DIR]

Loopback only; the senders are bounded by --senders and --hold-s. --source DIR runs the server
of another checkout (its aclserve package and models/), e.g. to compare before and after.
A server that dies during the attack ends the run in one error line, exit status 1; Ctrl-C or
SIGTERM stop it and remove the run's folders, exit 130 (tools/bench_run.py).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import struct
import sys
import time

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attack_server import RssSampler  # noqa: E402
from bench_args import non_negative_float, non_negative_int, positive_float, positive_int  # noqa: E402
from bench_common import ManagedProcess, free_port, keep_if_failed, wait_ready  # noqa: E402
from bench_run import ensure_running, run_async, run_folder, run_tool  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVICE = "/inference.GRPCInferenceService/"
INFER = SERVICE + "ModelInfer"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
MAX_FRAME = 16384  # HTTP/2's default SETTINGS_MAX_FRAME_SIZE
DEFAULT_WINDOW = 65535


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def call_headers(path: str, authority: str) -> bytes:
    """A HEADERS frame opening stream 1 (HPACK literals without indexing, RFC 7541 6.2.2)."""
    block = b"".join(b"\x00" + bytes([len(k)]) + k.encode() + bytes([len(v)]) + v.encode() for k, v in [
        (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", authority),
        ("content-type", "application/grpc"), ("te", "trailers")])
    return frame(HEADERS, 0x4, 1, block)


def infer_message(megabytes: int) -> bytes:
    """A gRPC-framed ModelInferRequest for digits whose raw input is `megabytes` MB."""
    request = pb.ModelInferRequest(model_name="digits")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 64])
    request.raw_input_contents.append(bytes(megabytes << 20))
    body = request.SerializeToString()
    return b"\x00" + struct.pack(">I", len(body)) + body


class SlowSender:
    """One raw HTTP/2 connection with one ModelInfer call; sends its message slowly."""

    def __init__(self):
        self.conn_window = DEFAULT_WINDOW
        self.stream_window = DEFAULT_WINDOW
        self.initial_window = DEFAULT_WINDOW
        self.changed = asyncio.Event()
        self.outcome = "open"

    async def run(self, host: str, port: int, path: str, message: bytes, send_s: float, stall: int,
                  hold_s: float) -> str:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            return "connect failed"
        frames = asyncio.ensure_future(self._read(reader, writer))
        try:
            writer.write(PREFACE + frame(SETTINGS, 0, 0) + call_headers(path, f"{host}:{port}"))
            deadline = time.monotonic() + hold_s
            await self._send(writer, message[:len(message) - stall], send_s, deadline)
            remaining = deadline - time.monotonic()
            if self.outcome == "open" and remaining > 0:
                await asyncio.wait([frames], timeout=remaining)
        except OSError:
            self.outcome = "closed"
        finally:
            frames.cancel()
            writer.close()
        return self.outcome

    async def _send(self, writer, data: bytes, send_s: float, deadline: float) -> None:
        start, sent = time.monotonic(), 0
        while sent < len(data) and self.outcome == "open" and time.monotonic() < deadline:
            room = min(self.conn_window, self.stream_window, MAX_FRAME, len(data) - sent)
            if room <= 0:
                self.changed.clear()
                try:
                    await asyncio.wait_for(self.changed.wait(), max(0.01, deadline - time.monotonic()))
                except asyncio.TimeoutError:
                    return
                continue
            writer.write(frame(DATA, 0, 1, data[sent:sent + room]))
            await writer.drain()
            sent += room
            self.conn_window -= room
            self.stream_window -= room
            ahead = start + send_s * sent / len(data) - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)

    async def _read(self, reader, writer) -> None:
        """Acknowledge SETTINGS and PINGs, follow the windows, note how the call ends."""
        try:
            while True:
                head = await reader.readexactly(9)
                length, kind, flags = int.from_bytes(head[:3], "big"), head[3], head[4]
                stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
                payload = await reader.readexactly(length)
                if kind == SETTINGS and not flags & 1:
                    for i in range(0, len(payload), 6):
                        key, value = struct.unpack(">HI", payload[i:i + 6])
                        if key == 4:
                            self.stream_window += value - self.initial_window
                            self.initial_window = value
                    writer.write(frame(SETTINGS, 1, 0))
                elif kind == PING and not flags & 1:
                    writer.write(frame(PING, 1, 0, payload))
                elif kind == WINDOW_UPDATE:
                    increment = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
                    if stream == 0:
                        self.conn_window += increment
                    else:
                        self.stream_window += increment
                elif stream == 1 and (kind == RST_STREAM or (kind == HEADERS and flags & 1)):
                    self.outcome = "ended by the server"
                    return
                self.changed.set()
        except (asyncio.IncompleteReadError, OSError):
            self.outcome = "closed"
        finally:
            self.changed.set()


def probe_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="digits")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 64])
    request.raw_input_contents.append(np.full((1, 64), 8.0, np.float32).tobytes())
    return request


async def probe_loop(target: str, stop: asyncio.Event, results: list) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        infer = channel.unary_unary(INFER, pb.ModelInferRequest.SerializeToString, pb.ModelInferResponse.FromString)
        while not stop.is_set():
            try:
                await infer(probe_request(), timeout=10)
                results.append("OK")
            except grpc.aio.AioRpcError as e:
                results.append(e.code().name)
            await asyncio.sleep(0.2)


async def attack(args, grpc_port: int, sampler: RssSampler) -> dict:
    message = infer_message(args.message_mb)
    await asyncio.sleep(1.0)
    before = sampler.rss()
    sampler.reset()
    stop, probes = asyncio.Event(), []
    prober = asyncio.ensure_future(probe_loop(f"127.0.0.1:{grpc_port}", stop, probes))
    start = time.monotonic()
    outcomes = await asyncio.gather(*(SlowSender().run("127.0.0.1", grpc_port, SERVICE + args.method, message,
                                                      args.send_s, args.stall_kb << 10, args.hold_s)
                                      for _ in range(args.senders)))
    seconds = time.monotonic() - start
    await asyncio.sleep(3.0)
    stop.set()
    await prober
    return {"method": args.method, "senders": args.senders, "message_mb": args.message_mb,
            "seconds": round(seconds, 1),
            "rss_before_mb": round(before / 2**20), "rss_peak_mb": round(sampler.peak() / 2**20),
            "rss_after_mb": round(sampler.rss() / 2**20),
            "calls": {k: outcomes.count(k) for k in sorted(set(outcomes))},
            "probes_ok": probes.count("OK"), "probes": len(probes),
            "probe_failures": sorted({p for p in probes if p != "OK"})}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--senders", type=positive_int, default=64,
                    help="HTTP/2 connections, a slow call each (default %(default)s)")
    ap.add_argument("--message-mb", type=positive_int, default=8,
                    help="MB of each call's message (default %(default)s)")
    ap.add_argument("--send-s", type=non_negative_float, default=10.0,
                    help="seconds over which a message but its last --stall-kb is sent (default %(default)g)")
    ap.add_argument("--stall-kb", type=non_negative_int, default=100,
                    help="KB of each message never sent (default %(default)s)")
    ap.add_argument("--hold-s", type=positive_float, default=90.0,
                    help="seconds each call is held open at most, its sending included (default %(default)g)")
    ap.add_argument("--method", default="ModelInfer",
                    help="the RPC the senders call, any method of the service (default %(default)s)")
    ap.add_argument("--config", help="server config file merged over the embedded default (default none)")
    ap.add_argument("--source", default=ROOT, help="the checkout whose server runs (default: this one)")
    args = ap.parse_args(argv)
    if args.stall_kb << 10 >= args.message_mb << 20:
        ap.error(f"--stall-kb {args.stall_kb} leaves nothing of a {args.message_mb} MB message to send")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    return run_tool("grpc_slow_senders", lambda: run(args))


def run(args) -> int:
    source = os.path.abspath(args.source)
    port, grpc_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "aclserve", "serve", "--models", os.path.join(source, "models"), "--port", str(port),
           "--grpc-port", str(grpc_port), "--device", "cpu", "--model-control-mode", "none"]
    if args.config:
        cmd += ["--config", os.path.abspath(args.config)]
    env = dict(os.environ, PYTHONPATH=source)  # `-m aclserve` from `source` imports its package
    with run_folder("aclserve-grpc-slow-") as folder:
        server = ManagedProcess(cmd, os.path.join(folder, "server.log"), cwd=source, env=env)
        try:
            wait_ready(server, f"http://127.0.0.1:{port}", 120)
            sampler = RssSampler(server.proc.pid)
            try:
                row = run_async(attack(args, grpc_port, sampler))
            finally:  # a dead server's calls are refused connections, no measurement of it
                sampler.close()
                ensure_running(server, "the attack")
            print(json.dumps(row))
        finally:
            code = server.close()
        print(f"server exit status {code}; {keep_if_failed(folder, code != 0)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
