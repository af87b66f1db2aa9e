"""The real server in tests: free ports, a test configuration, the server in a thread of its own
(ServerThread) with one-request clients for it (request; post_status, blocking, for a test's own
threads; index_of, wait_until and in_thread for tests that watch it load), and the app on the
test's own loop (started_app)."""
from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import json
import os
import random
import socket
import threading
import time
import urllib.error
import urllib.request

import aiohttp
import aiohttp.web


# Ports free_port() hands out: below the kernel's ephemeral range, a span for each pytest-xdist
# worker. A port the kernel picked (bind to 0) was free when picked, but until the server bound it
# any client connection of the other worker could take it as its own port, or its free_port() the
# same one: a server that could not bind exited, and its test read another test's server (a model
# "m" READY where it held the compile lock: CI, 2026-12-06). Each process starts at a random place
# of its span: two test runs side by side (not workers of one run) handed out the same ports in
# the same order, and their servers met.
PORTS_FROM, PORTS_A_WORKER = 20_000, 1_500
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").lstrip("gw") or 0)
_handed = itertools.count(random.randrange(PORTS_A_WORKER))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for the gRPC endpoint, where 0 means off, and for
    `aclserve serve` subprocesses): the next free one of this worker's span, which no other worker
    and no client connection takes (any port the kernel picks where the span does not fit)."""
    low = PORTS_FROM + _WORKER * PORTS_A_WORKER
    if low + PORTS_A_WORKER <= _ephemeral_low():
        for _ in range(PORTS_A_WORKER):
            port = low + next(_handed) % PORTS_A_WORKER
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listened_by(pid: int, port: int) -> bool:
    """Whether process `pid` holds the socket listening on TCP `port` (a server that could not bind
    its port exits, and another process listening there answers its test in its place)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as rows:
            for row in list(rows)[1:]:
                local, state, inode = (fields := row.split())[1], fields[3], fields[9]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # (0A: LISTEN)
                    inodes.add(f"socket:[{inode}]")
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
    return False


def _ephemeral_low() -> int:
    """The lowest port the kernel picks for a socket bound to 0 or connecting (Linux; 1024 elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 1024


def server_config(models_dir, **overrides):
    """A ServerConfig for tests: any port, no gRPC, CPU, explicit model control, small limits."""
    from aclserve.config import load_server_config
    values = {"models_dir": str(models_dir), "port": 0, "grpc_port": 0, "device": "cpu",
              "model_control_mode": "explicit", "max_body_bytes": 1 << 20, "max_json_bytes": 768 << 10,
              "max_json_elements": 1 << 18, "shutdown_timeout_s": 20, "log_level": "warning",
              "grpc_max_message_bytes": 1 << 20}  # (at most max_body_bytes with gRPC on)
    values.update(overrides)
    return load_server_config(None, values)


class ServerThread:
    """Runs aclserve.app.serve() on its own loop in a thread, so tests can use blocking
    clients (tritonclient) directly and aiohttp clients under asyncio.run(). close() stops it in
    order. As a context manager it starts on entry, closes on exit and then raises the error the
    server ended with, if any."""

    def __init__(self, config, run=asyncio.run):
        """`run` runs the server's coroutine to completion (asyncio.run, or uvloop.run as
        `aclserve serve` does where uvloop is installed)."""
        self.config = config
        self.url = ""
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=run, args=(self._main(),), daemon=True)

    async def _main(self):
        from aclserve.app import serve
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        started = self._loop.create_future()
        task = asyncio.create_task(serve(self.config, started=started, stop=self._stop))
        await asyncio.wait([task, started], return_when=asyncio.FIRST_COMPLETED)
        if started.done():
            host, port = started.result()
            self.url = f"{host}:{port}"
            self._ready.set()
        try:
            await task
        except BaseException as e:
            self.error = e
        finally:
            self._ready.set()

    def start(self) -> "ServerThread":
        self._thread.start()
        self._ready.wait(120)
        if not self.url:
            raise RuntimeError(f"server did not start: {self.error!r}")
        return self

    def on_loop(self, callback) -> None:
        """Run `callback` on the server's loop, from any thread, after what is scheduled there."""
        self._loop.call_soon_threadsafe(callback)

    def begin_close(self) -> None:
        """Have the server shut down as on SIGTERM (close() waits for it to end)."""
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)

    def close(self) -> None:
        self.begin_close()
        self._thread.join(60)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()
        if self.error is not None and exc_info[0] is None:
            raise self.error


def request(server, method: str, path: str, **kwargs) -> tuple[int, dict, bytes]:
    """One aiohttp request to a ServerThread under asyncio.run(): (status, headers, body)."""
    if isinstance(kwargs.get("data"), bytes):
        kwargs["data"] = io.BytesIO(kwargs["data"])  # streamed: aiohttp warns that a large bytes body blocks the loop

    async def go():
        async with aiohttp.ClientSession() as session:
            async with session.request(method, f"http://{server.url}{path}", **kwargs) as resp:
                return resp.status, dict(resp.headers), await resp.read()
    return asyncio.run(go())


def json_call(url: str, path: str, body: bytes | None = None) -> tuple[int, object]:
    """(status, its JSON body) of a GET, or a POST of `body`, to `path` at `url` (host:port): an
    error's too; (0, None) when nothing answers (a server still starting, or gone)."""
    call = urllib.request.Request(f"http://{url}{path}", data=body, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(call, timeout=60) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")
    except (urllib.error.URLError, ConnectionError):
        return 0, None


def post_status(url: str, path: str, body: bytes) -> int:
    """The HTTP status of one POST of `body` to `path` at `url` (host:port), an error's too."""
    post = urllib.request.Request(f"http://{url}{path}", data=body, method="POST")
    try:
        with urllib.request.urlopen(post, timeout=60) as answer:
            return answer.status
    except urllib.error.HTTPError as e:
        e.close()
        return e.code


def index_of(server) -> dict[tuple[str, str], tuple[str, str]]:
    """The repository index of a ServerThread as a client reads it: (name, version) -> (state, reason)."""
    status, _, body = request(server, "POST", "/v2/repository/index")
    assert status == 200, body
    return {(row["name"], row.get("version", "")): (row["state"], row.get("reason", "")) for row in json.loads(body)}


def wait_until(check, what: str, guard_s: float = 120.0) -> None:
    """Until `check()` holds, looked at every 20 ms: a hang guard of `guard_s`, not a timing."""
    give_up = time.monotonic() + guard_s
    while not check():
        if time.monotonic() > give_up:
            raise AssertionError(f"never {what}")
        time.sleep(0.02)


async def until(predicate) -> None:
    """On a loop, until `predicate()` holds, looked at every 10 ms: a hang guard of 30 s, not a timing."""
    for _ in range(3000):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never came")


def in_thread(target) -> tuple[threading.Thread, list]:
    """`target()` in a daemon thread of its own (a blocking call: a load held by a compile); what it
    returned lands in the list."""
    answers: list = []
    thread = threading.Thread(target=lambda: answers.append(target()), daemon=True)
    thread.start()
    return thread, answers


async def started_app(config):
    """The app as `aclserve serve` builds it, listening on 127.0.0.1 (any port) on the running
    loop: (runner, state, url, runtime, repository). `await runner.cleanup()` closes the
    repository, then the runtime."""
    from aclserve.app import build_repository
    from aclserve.runtime import AclRuntime
    from aclserve.server.app import create_app, make_runner
    from aclserve.server.app_keys import STATE
    runtime = AclRuntime(device="cpu")
    repo = build_repository(config, runtime)
    app = create_app(config, repo, runtime)
    runner = make_runner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    await app[STATE].loading  # bound first, then loaded
    host, port = runner.addresses[0][:2]
    return runner, app[STATE], f"http://{host}:{port}", runtime, repo


def started_with_grpc(config):
    """For a fixture: `yield from` it. A started ServerThread whose `grpc_url` is its gRPC
    address (the config names a free grpc_port); closed after, raising the error it ended with."""
    srv = ServerThread(config).start()
    srv.grpc_url = f"127.0.0.1:{config.grpc_port}"
    yield srv
    srv.close()
    if srv.error is not None:
        raise srv.error
