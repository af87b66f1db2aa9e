#!/usr/bin/env python3
"""Open-loop HTTP load: requests arrive at a fixed mean rate (Poisson) whatever the answers,
as independent users behind a connection pool would send them. Each request goes on an idle
keep-alive connection (the one freed last) or a new one, up to --max-conns; a request not
answered within --timeout is given up (its connection closed). Prints one JSON line: the
answers per second by status in the measured window (after --warmup), client timeouts and
requests that found no connection, and p50 / p99 of the 200s (null when none came). Exit status
1 when no request of the window was answered 200 (a server down or refusing everything: no
figures to use), 2 on a bad option (a URL that is not http:// with a host, a header without its
colon), 130 when interrupted (Ctrl-C, SIGTERM: the requests in flight given up, the connections
closed).

    python tools/open_loop.py URL BODY_FILE --rate 6600 [--seconds 10] [--warmup 2]
        [--content-type application/json] [--header "Name: value"] [--max-conns 4000] [--timeout 1]

One process, asyncio (uvloop when installed) on raw sockets: about 7,000 requests a second of
49 KB bodies on one core of the development machine (checked against a trivial endpoint).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import sys
from urllib.parse import urlsplit

from bench_args import non_negative_float, positive_float, positive_int  # (tools/, beside this file)
from bench_run import run_async, run_tool


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, Content-Length answers only."""

    def __init__(self):
        self.transport = None
        self.closed = False
        self.answer: asyncio.Future | None = None
        self._buf = bytearray()

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self._buf += data
        if self.answer is None or self.answer.done():
            return
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self._buf[:end]).lower()
        length, close = 0, False
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name == b"content-length":
                length = int(value)
            elif name == b"connection":
                close = value.strip() == b"close"
        if len(self._buf) < end + 4 + length:
            return
        del self._buf[:end + 4 + length]
        self.answer.set_result((int(head.split(b" ", 2)[1]), close))

    def connection_lost(self, exc):
        self.closed = True
        if self.answer is not None and not self.answer.done():
            self.answer.set_result((0, True))  # closed by the server before an answer


async def run(url: str, body: bytes, rate: float, seconds: float, warmup: float, headers: list[str],
              max_conns: int, timeout: float, seed: int = 0) -> dict:
    if not (rate > 0 and seconds > 0):  # (a rate below 0 scheduled arrivals ever earlier: an endless loop)
        raise ValueError(f"the rate and the window need to be above 0, got {rate:g}/s for {seconds:g} s")
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")  # (the query was dropped)
    request = (f"POST {target} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
               + "".join(f"{h}\r\n" for h in headers)
               + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    loop = asyncio.get_running_loop()
    idle: collections.deque[_Connection] = collections.deque()
    counts: collections.Counter = collections.Counter()
    latencies: list[float] = []
    open_conns = 0
    start = loop.time()
    measure_from, end = start + warmup, start + warmup + seconds

    async def one(sent: float) -> None:
        nonlocal open_conns
        measured = measure_from <= sent < end
        conn = None
        while idle and conn is None:
            candidate = idle.pop()
            if candidate.closed:  # closed by the server while idle: its place is free (it was kept taken)
                open_conns -= 1
            else:
                conn = candidate
        if conn is None:
            if open_conns >= max_conns:
                counts["no connection"] += measured
                return
            open_conns += 1
            try:
                _, conn = await loop.create_connection(_Connection, parts.hostname, parts.port or 80)
            except (OSError, UnicodeError):  # (UnicodeError: a host the resolver's idna encoding refuses, a..b)
                open_conns -= 1
                counts["connect error"] += measured
                return
        conn.answer = loop.create_future()
        conn.transport.write(request)
        try:
            status, close = await asyncio.wait_for(conn.answer, max(0.001, sent + timeout - loop.time()))
        except asyncio.TimeoutError:
            conn.transport.close()
            open_conns -= 1
            counts["timeout"] += measured
            return
        except asyncio.CancelledError:  # (an interruption: the request given up, its connection closed)
            conn.transport.close()
            raise
        if measured:
            counts[str(status) if status else "closed"] += 1
            if status == 200:
                latencies.append(loop.time() - sent)
        if close or conn.closed:
            conn.transport.close()
            open_conns -= 1
        else:
            conn.answer = None
            idle.append(conn)

    rng = random.Random(seed)
    tasks: set[asyncio.Task] = set()
    due = start
    try:
        while due < end:
            now = loop.time()
            while due <= now and due < end:
                task = loop.create_task(one(due))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                due += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, due - loop.time()))
        if tasks:
            await asyncio.wait(tasks)
    finally:  # (cancelled, by an interruption: the requests in flight given up, each closing its connection)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for conn in idle:
            conn.transport.close()
    latencies.sort()

    def pct(q: float) -> float | None:  # (none without a 200: 0.0 read as an answer in no time)
        return round(latencies[int(q * (len(latencies) - 1))] * 1000, 1) if latencies else None

    return {"offered_per_s": rate, "per_s": {k: v / seconds for k, v in sorted(counts.items())},
            "ok_per_s": counts["200"] / seconds, "p50_ms": pct(0.5), "p99_ms": pct(0.99)}


def http_url(text: str) -> str:
    """An http:// URL with a host (a URL without one sent every request to a connection that failed,
    each task's traceback printed, "Task exception was never retrieved"; an https:// one was sent
    plain HTTP: this client speaks no TLS)."""
    try:
        parts = urlsplit(text)
        parts.port  # (raises ValueError for a port that is no number or out of range)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e}, got {text!r}") from None
    if parts.scheme == "https":
        raise argparse.ArgumentTypeError(f"this client speaks no TLS: needs an http:// URL, got {text!r}")
    if parts.scheme != "http" or not parts.hostname:
        raise argparse.ArgumentTypeError("needs an http:// URL with a host, as http://127.0.0.1:8000/v2/models/"
                                         f"NAME/infer, got {text!r}")
    return text


def header(text: str) -> str:
    """'Name: value' (one without its colon was sent as given, and every answer was 400)."""
    name, colon, value = text.partition(":")
    if not colon or not name or any(c in name for c in " \t()<>@,;\\\"/[]?={}") or "\r" in text or "\n" in text:
        raise argparse.ArgumentTypeError(f"needs 'Name: value', got {text!r}")
    return f"{name}: {value.strip()}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url", type=http_url, help="http://HOST:PORT/PATH the requests are posted to")
    p.add_argument("body_file", help="the request body, a file")
    p.add_argument("--rate", type=positive_float, required=True, help="mean requests per second")
    p.add_argument("--seconds", type=positive_float, default=10.0, help="the measured window (default %(default)g)")
    p.add_argument("--warmup", type=non_negative_float, default=2.0,
                   help="seconds sent before the window (default %(default)g)")
    p.add_argument("--content-type", default="application/json", help="default %(default)s")
    p.add_argument("--header", type=header, action="append", default=[],
                   help="extra request header, 'Name: value' (repeat for more; default none)")
    p.add_argument("--max-conns", type=positive_int, default=4000,
                   help="open connections at most (default %(default)s)")
    p.add_argument("--timeout", type=positive_float, default=1.0,
                   help="seconds a client waits for its answer (default %(default)g)")
    args = p.parse_args(argv)
    try:
        with open(args.body_file, "rb") as f:
            body = f.read()
    except OSError as e:
        p.error(f"body_file: {e.strerror}: {args.body_file}")
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    return run_tool("open_loop", lambda: measure(args, body), cleaned="its connections closed")


def measure(args, body: bytes) -> int:
    """The window, its figures printed; its exit status."""
    result = run_async(run(args.url, body, args.rate, args.seconds, args.warmup,
                           [f"Content-Type: {args.content_type}"] + args.header, args.max_conns, args.timeout))
    print(json.dumps(result), flush=True)
    if not result["ok_per_s"]:
        print(f"open_loop: no request of the window was answered 200 (answers and failures a second: "
              f"{result['per_s'] or 'none'})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
