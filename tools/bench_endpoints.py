#!/usr/bin/env python3
"""The fixed-answer HTTP endpoints tools/bench_server.py measures beside the server: a trivial
asyncio protocol (the load generator's ceiling) and a bare aiohttp app (the floor of any aiohttp
front end).

`python tools/bench_endpoints.py trivial-server [--port 0]` runs the trivial endpoint in the
foreground (`aiohttp-floor` the aiohttp app): it prints the bound port on one stdout line, then
answers every HTTP/1.1 request (any method, any path, keep-alive, Content-Length bodies) with one
fixed 200 JSON body until SIGTERM/SIGINT.
"""
from __future__ import annotations

import argparse
import asyncio
import signal
import sys

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
