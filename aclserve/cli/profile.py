"""`aclserve profile MODEL`: closed-loop load for N seconds with every request traced, then the
trace file and a summary a person reads in ten seconds (trace/analysis.py).

In-process (default): the models folder is loaded as `aclserve serve` would (same repository,
batchers, runtime) and C client tasks drive the infer path of the HTTP server without the
socket (`server/infer.infer_body`: decode, queue, batch, encode), so the process CPU time is the
server's. With --url: C aiohttp clients load a running server; its trace settings for the model
are set to trace every request into profile-MODEL-PID.json inside its trace folder, turned OFF
at the end (which writes the file), read back from --trace-dir (the server must share this
machine's filesystem), and the model's own trace settings dropped.
"""
from __future__ import annotations

import asyncio
import functools
import math
import os
import sys
import time

import numpy as np

from ..errors import ServeError
from .infer import check_url
from .usage import UsageError


def add_commands(sub) -> None:
    p = sub.add_parser("profile", help="trace a closed-loop load against a model and summarise where time goes",
                       description="Run a closed-loop load against the model for --seconds with every request "
                                   "traced, write the trace and print a summary of where the time goes. "
                                   "In-process on the models folder by default; --url profiles a running server.")
    p.add_argument("model")
    p.add_argument("--seconds", type=float, default=10.0, help="load duration (default %(default)s)")
    p.add_argument("--clients", type=int, default=8, help="concurrent closed-loop clients (default %(default)s)")
    p.add_argument("--rows", type=int, default=1, help="batch rows per request (default %(default)s)")
    p.add_argument("--models", help="models folder, in-process mode (default models)")
    p.add_argument("--device", choices=("auto", "cpu", "npu"), help="in-process mode (default auto)")
    p.add_argument("--url", help="profile a running server instead (e.g. http://127.0.0.1:8000)")
    p.add_argument("--trace-dir", help="with --url: the server's trace folder, as seen from here (default traces)")
    p.add_argument("--trace", metavar="FILE", help="where to write the trace (default profile-<model>.json)")
    p.add_argument("--png", metavar="FILE", help="also draw the timeline (a window of it) to a PNG (matplotlib)")
    p.add_argument("--png-window-ms", type=float, default=20.0, help="width of the PNG's window (default %(default)s)")
    p.set_defaults(func=run_profile)


def _check_mode(args) -> None:
    """Flags of the other mode would be taken and do nothing: refused, and the defaults filled in."""
    local = [flag for flag, value in (("--models", args.models), ("--device", args.device)) if value is not None]
    if args.url and local:
        raise UsageError(f"{' and '.join(local)} appl{'ies' if len(local) == 1 else 'y'} to the in-process mode; "
                         "with --url the server's own are used")
    if not args.url and args.trace_dir is not None:
        raise UsageError("--trace-dir applies with --url (the running server's trace folder)")
    args.models = "models" if args.models is None else args.models
    args.device = "auto" if args.device is None else args.device
    args.trace_dir = "traces" if args.trace_dir is None else args.trace_dir


def run_profile(args) -> int:
    from ..trace import analysis
    if not 0 < args.seconds < math.inf or args.clients < 1 or args.rows < 1:  # NaN fails the first
        raise UsageError("--seconds, --clients and --rows must be positive (and --seconds finite)")
    if args.png and not 0 < args.png_window_ms < math.inf:
        raise UsageError("--png-window-ms must be positive and finite")
    _check_mode(args)
    out = args.trace or f"profile-{args.model}.json"
    for path in filter(None, (out, args.png)):  # found out now, not after the run
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise UsageError(f"cannot write {path}: folder {folder} does not exist")
        if os.path.isdir(path):  # the write after the run was a traceback (the run's result lost)
            raise UsageError(f"cannot write {path}: it is a folder")
    if args.url:
        import aiohttp
        check_url(args.url)
        try:
            events, done, cpu_s = asyncio.run(_remote(args))
        except aiohttp.ClientError as e:
            print(f"aclserve profile: error: cannot reach {args.url}: {e}", file=sys.stderr)
            return 1
    else:
        from ..acl import AclUnavailable
        try:
            events, done, cpu_s = asyncio.run(_in_process(args))
        except AclUnavailable as e:  # --device npu without CANN
            raise UsageError(str(e)) from None
    import orjson
    with open(out, "wb") as f:
        f.write(orjson.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    summary = analysis.summarize(events, cpu_s)
    print(f"{args.model}: {done} requests in {args.seconds:g} s ({done / args.seconds:,.0f} req/s), "
          f"{args.clients} clients, {args.rows} row(s) each; trace: {out}")
    print(analysis.format_summary(summary))
    if args.png:
        from ..trace.plot import render_png
        render_png(events, args.png, args.png_window_ms)
        print(f"timeline: {args.png} ({args.png_window_ms:g} ms window)")
    return 0


def _body(inputs_meta: list[tuple[str, str, list[int]]], rows: int) -> tuple[bytes, int]:
    from ..dtypes import kserve_to_numpy
    from .infer import build_request
    rng = np.random.default_rng(0)
    arrays = {}
    for name, datatype, shape in inputs_meta:
        if datatype == "BYTES":
            raise UsageError(f"input {name!r} takes encoded images (BYTES): profile sends random tensors, so it "
                             f"profiles models with numeric inputs only")
        dims = [rows if (i == 0 and d == -1) else max(d, 1) for i, d in enumerate(shape)]
        arrays[name] = rng.standard_normal(dims).astype(kserve_to_numpy(datatype))
    return build_request(arrays, [])


async def _closed_loop(clients: int, seconds: float, one) -> int:
    done = 0
    end = time.monotonic() + seconds

    async def client():
        nonlocal done
        while time.monotonic() < end:
            await one()
            done += 1
    await asyncio.gather(*(client() for _ in range(clients)))
    return done


async def _in_process(args):
    from ..app import build_repository, build_runtime
    from ..config import load_server_config
    from ..trace import chrome
    from ..server.infer import counted_infer
    from ..server.state import ServerState

    if not os.path.isdir(args.models):
        what = "is a file, not a folder" if os.path.exists(args.models) else "does not exist"
        raise UsageError(f"models folder {args.models!r} {what}")
    config = load_server_config(None, {"models_dir": args.models, "device": args.device, "grpc_port": 0,
                                       "model_control_mode": "explicit",
                                       "trace": {"level": "TIMESTAMPS", "rate": 1}})
    runtime = build_runtime(config).start()
    repo = build_repository(config, runtime)
    try:
        await repo.start()
        state = ServerState(config, repo, runtime)
        state.started = True
        try:
            served = repo.get(args.model)
        except Exception as e:
            raise UsageError(f"model {args.model!r}: {getattr(e, 'message', e)}") from None
        meta = [(s.name, s.datatype, list(s.shape)) for s in served.inputs]
        body, header_length = _body(meta, args.rows)
        work = functools.partial(_work, body, header_length)
        try:  # one request first: what the model refuses (too many rows, say) is one line
            await counted_infer(state, args.model, None, work, protocol="inproc")
        except ServeError as e:
            raise UsageError(f"model {args.model!r} refused the request: {e.message}") from None
        await _closed_loop(args.clients, min(1.0, args.seconds / 5), lambda: counted_infer(
            state, args.model, None, work, protocol="inproc"))  # warm-up, not traced below
        state.tracer.take()
        traces = []

        async def drain():  # the tracer keeps at most MAX_PENDING: collect them as they come
            while True:
                await asyncio.sleep(0.2)
                traces.extend(state.tracer.take())
        drainer = asyncio.ensure_future(drain())
        cpu0 = time.process_time()
        try:
            done = await _closed_loop(args.clients, args.seconds, lambda: counted_infer(
                state, args.model, None, work, protocol="inproc"))
        finally:
            drainer.cancel()
        cpu_s = time.process_time() - cpu0
        traces.extend(state.tracer.take())
        return chrome.events(traces), done, cpu_s
    finally:
        await repo.close()
        runtime.close()


async def _work(body, header_length, rec, trace):
    from ..server.infer import infer_body
    return await infer_body(rec, body, header_length, trace)


async def _own_trace_settings(session, base: str, setting: str) -> dict:
    """The model's trace settings as an update that puts them back: each one that differs from
    the global one (the model set it), and null for the rest (they follow the global ones).
    A setting the model set to the global value comes back following it."""
    async with session.get(setting) as resp:
        own = await resp.json() if resp.status == 200 else {}
    async with session.get(f"{base}/v2/trace/setting") as resp:
        shared = await resp.json() if resp.status == 200 else {}
    return {key: (value if value != shared.get(key) else None) for key, value in own.items()}


async def _remote(args):
    import aiohttp
    import orjson

    base = args.url.rstrip("/")
    name = f"profile-{args.model}-{os.getpid()}.json"
    setting = f"{base}/v2/models/{args.model}/trace/setting"
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{base}/v2/models/{args.model}") as resp:
            if resp.status != 200:
                raise UsageError(f"{base}: model {args.model!r}: HTTP {resp.status}: {await resp.text()}")
            meta = [(t["name"], t["datatype"], t["shape"]) for t in (await resp.json())["inputs"]]
        body, header_length = _body(meta, args.rows)
        headers = {"Inference-Header-Content-Length": str(header_length), "Content-Type": "application/octet-stream"}
        url = f"{base}/v2/models/{args.model}/infer"

        async def one():
            async with session.post(url, data=body, headers=headers) as resp:
                await resp.read()
        async with session.post(url, data=body, headers=headers) as resp:  # what it refuses is one line
            if resp.status != 200:
                raise UsageError(f"{base}: model {args.model!r} refused the request: HTTP {resp.status}: "
                                 f"{await resp.text()}")
        await _closed_loop(args.clients, min(1.0, args.seconds / 5), one)  # warm-up, untraced
        restore = await _own_trace_settings(session, base, setting)
        async with session.post(setting, json={"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1",
                                               "log_frequency": "0", "trace_file": name,
                                               "trace_format": "chrome"}) as resp:
            if resp.status != 200:
                raise UsageError(f"{base}: could not turn tracing on: {await resp.text()}")
        try:
            done = await _closed_loop(args.clients, args.seconds, one)
        finally:
            async with session.post(setting, json={"trace_level": ["OFF"]}) as resp:
                await resp.read()  # tracing OFF writes the file
            async with session.post(setting, json=restore) as resp:  # the model's own as they were
                if resp.status != 200:
                    print(f"aclserve profile: warning: could not put the model's trace settings back "
                          f"({resp.status}: {await resp.text()}); they are {restore}", file=sys.stderr)
    path = os.path.join(args.trace_dir, name)
    for _ in range(300):
        if os.path.exists(path):
            break
        await asyncio.sleep(0.1)
    else:
        raise UsageError(f"the server did not write {path} (is --trace-dir its trace folder?)")
    with open(path, "rb") as f:
        events = orjson.loads(f.read())["traceEvents"]
    return events, done, None
