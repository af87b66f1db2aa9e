"""`aclserve profile MODEL`: closed-loop load for N seconds with every request traced, then the
trace file and a summary a person reads in ten seconds (trace/analysis.py).

In-process (default): the model is loaded from the models folder as `aclserve serve` would (same
repository, batchers, runtime; that model alone, in explicit mode) and C client tasks drive the
infer path of the HTTP server without the socket (`server/infer_pipeline.infer_body`: decode, queue,
batch, encode), so the process CPU time is the server's. With --url: C aiohttp clients load a
running server (profile_remote.py). Every request's outcome is counted (load.py): the rate is of
the requests answered, the refused are counted by reason.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import math
import os
import stat
from typing import Mapping

import numpy as np

from ..errors import ServeError
from ..quoting import counted
from . import termination
from .load import DRAIN_S, closed_loop, request_id, warm_up
from .output import print_err, print_out
from .client_tls import add_client_cert_options, client_tls
from .remote import (CLOSED_UNANSWERED, MAX_TIMEOUT_S, auth_headers, broke_off, check_url, host_unresolvable, os_reason,
                     redirect_refused, unreachable)
from .usage import FILE_NAME, FOLDER_NAME, UsageError, models_hint


def add_commands(sub) -> None:
    p = sub.add_parser("profile", help="trace a closed-loop load against a model and summarise where time goes",
                       description="Run a closed-loop load against the model for --seconds with every request "
                                   "traced, write the trace and print a summary of where the time goes. "
                                   "In-process by default (the model alone loaded from --models); --url profiles a "
                                   "running server.")
    p.add_argument("model")
    p.add_argument("--seconds", type=float, default=10.0, help="load duration (default %(default)s)")
    p.add_argument("--clients", type=int, default=8, help="concurrent closed-loop clients (default %(default)s)")
    p.add_argument("--rows", type=int, default=1, help="batch rows per request (default %(default)s)")
    p.add_argument("--models", metavar="DIR", type=FOLDER_NAME, help="models folder, in-process mode (default models)")
    p.add_argument("--device", type=str.lower, choices=("auto", "cpu", "npu"), help="in-process mode (default auto)")
    p.add_argument("--url", help="profile a running server instead (e.g. http://127.0.0.1:8000)")
    p.add_argument("--trace-dir", metavar="DIR", type=FOLDER_NAME,
                   help="with --url: the server's trace folder, as seen from here (default traces)")
    p.add_argument("--timeout", type=float,
                   help="with --url: seconds to wait to connect and for each answer (default 60)")
    add_client_cert_options(p, applies=" (with --url)")
    p.add_argument("--trace", metavar="FILE", type=FILE_NAME,
                   help="where to write the trace (default profile-<model>.json)")
    p.add_argument("--png", metavar="FILE", type=FILE_NAME,
                   help="also draw the timeline (a window of it) to a PNG (matplotlib)")
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
    if not args.url and args.timeout is not None:
        raise UsageError("--timeout applies with --url (the running server's answers)")
    if not args.url and (args.cert or args.key):
        raise UsageError("--cert and --key apply with --url (shown to the running server)")
    if args.timeout is not None and not 0 < args.timeout <= MAX_TIMEOUT_S:  # (NaN fails it too; infer's bound)
        raise UsageError(f"--timeout must be a positive number of seconds, at most {MAX_TIMEOUT_S:,} (30 days)")
    args.timeout = 60.0 if args.timeout is None else args.timeout
    args.models = "models" if args.models is None else args.models
    args.device = "auto" if args.device is None else args.device
    args.trace_dir = "traces" if args.trace_dir is None else args.trace_dir


def _check_writable(path: str) -> None:
    """Found out now, not after the run: create the file (removed again if it was not there)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"cannot write {path}: folder {folder} does not exist")
    if os.path.isdir(path):  # the write after the run was a traceback (the run's result lost)
        raise UsageError(f"cannot write {path}: it is a folder")
    existed = os.path.exists(path)
    try:
        with open(path, "ab"):  # (appending nothing: a file that exists keeps its content)
            pass
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror or e}") from None
    if not existed:
        os.remove(path)


MODEL_FILES = (".om", ".onnx")


def _check_not_over_models(flag: str, path: str, given: bool, models: str | None) -> None:
    """`--trace srv/digits.om --models srv` wrote the trace over the model it profiled: no output
    goes into the models folder (in-process: `models`), nor over a model file anywhere."""
    what = f"{flag} {path}" if given else f"the trace's default path, {path},"
    where = os.path.realpath(path)
    if models is not None:
        folder = os.path.realpath(models)
        if os.path.commonpath([where, folder]) == folder:
            raise UsageError(f"{what} is inside the models folder {models}; profile writes nothing there: "
                             f"give {flag} a path outside it")
    if where.endswith(MODEL_FILES) and os.path.isfile(where):
        raise UsageError(f"{what} is a model file; profile does not write over it: give {flag} another path")


def _check_outputs(args, out: str) -> None:
    outputs = [(flag, path) for flag, path in (("--trace", out), ("--png", args.png)) if path]
    for flag, path in outputs:
        _check_not_over_models(flag, path, flag == "--png" or bool(args.trace), None if args.url else args.models)
    if args.png and os.path.realpath(args.png) == os.path.realpath(out):  # (the PNG was drawn over the trace)
        what = f"--trace {out}" if args.trace else f"the trace's default path, {out},"
        raise UsageError(f"--png {args.png} is {what}: give the timeline another path")
    for _, path in outputs:
        _check_writable(path)
    if args.png:
        try:
            importlib.import_module("matplotlib")
        except ImportError:
            raise UsageError("--png needs matplotlib: pip install -e '.[plot]'") from None


def run_profile(args) -> int:
    if not 0 < args.seconds < math.inf or args.clients < 1 or args.rows < 1:  # NaN fails the first
        raise UsageError("--seconds, --clients and --rows must be positive (and --seconds finite)")
    if not 0 < args.png_window_ms < math.inf:  # (without --png too: a bad value was taken silently)
        raise UsageError("--png-window-ms must be positive and finite")
    _check_mode(args)
    out = args.trace or f"profile-{args.model}.json"
    _check_outputs(args, out)
    try:
        events, outcomes, cpu = _run(args)
    except RemoteFailed as e:
        print_err(f"aclserve profile: error: {e}")
        return 1
    return _report(args, out, events, outcomes, cpu)


class RemoteFailed(Exception):
    """--url: the server could not be profiled (not reached, no answer, not KServe, bad trace)."""


def _run(args):
    if not args.url:
        from ..acl import AclUnavailable, npu_missing
        from ..config import ConfigError
        from ..repository import RepositoryError
        from .serve import check_environment
        check_environment()  # (ACLSERVE_DEVICE=gpu was a ValueError traceback from the runtime's start)
        try:
            return termination.run(_in_process(args))
        except AclUnavailable as e:  # --device npu (its only device setting) or ACLSERVE_DEVICE=npu without CANN
            raise UsageError(str(npu_missing("--device npu", True) if e.by_setting else e)) from None
        except RepositoryError as e:  # a models folder it cannot read
            raise UsageError(str(e)) from None
        except ConfigError as e:  # as serve says it: an ACLSERVE_API_TOKEN no client could send (server/auth.py)
            raise UsageError(f"bad configuration: {e}") from None
    import aiohttp
    from .profile_remote import Redirected, ServerGone, ServerRefused, TraceUnreadable, run_remote
    from .usage import NOT_HTTP1_HINT, NotKServe, one_line
    check_url(args.url)
    auth_headers()  # (checked before the run)
    tls = client_tls(args)
    cannot = host_unresolvable(args.url)
    if cannot:
        raise RemoteFailed(unreachable(args.url, cannot))
    try:
        return termination.run(run_remote(args, _body, tls))
    except asyncio.TimeoutError:  # (before ClientError: aiohttp's timeouts are both)
        raise RemoteFailed(f"no answer from {args.url} within {args.timeout:g} s (--timeout)") from None
    except aiohttp.ClientConnectorError as e:  # (said as infer says it: aiohttp's words are "... ssl:default [...]")
        raise RemoteFailed(unreachable(args.url, getattr(e, "certificate_error", e.os_error), args.cert)) from None
    except (aiohttp.ClientResponseError, NotKServe) as e:  # (a gRPC port: "Bad status line", HTML, ...)
        said = one_line(getattr(e, "message", e)).rstrip(":")  # (aiohttp's own is a multi-line repr)
        if said.startswith("Bad status line"):  # (what aiohttp says of HTTP/2 frames, without them)
            said = f"{said}, not HTTP/1.1 {NOT_HTTP1_HINT}"
        raise RemoteFailed(f"{args.url} did not answer as a KServe v2 HTTP server: {said}") from None
    except aiohttp.ServerDisconnectedError:  # (a TLS port, a server refusing --cert)
        raise RemoteFailed(broke_off(args.url, CLOSED_UNANSWERED, args.cert)) from None
    except aiohttp.ClientError as e:  # (the connection reset mid-answer)
        said = os_reason(e) if isinstance(e, OSError) else one_line(e) or type(e).__name__
        raise RemoteFailed(broke_off(args.url, said, args.cert)) from None
    except Redirected as e:
        raise RemoteFailed(redirect_refused(args.url, e.status, e.location)) from None
    except ServerRefused as e:
        raise RemoteFailed(f"{args.url.rstrip('/')}: {e}") from None
    except (TraceUnreadable, ServerGone) as e:
        raise RemoteFailed(str(e)) from None


def _report(args, out: str, events: list[dict], outcomes, cpu) -> int:
    """The summary, the trace file and the PNG; status 1 when nothing was answered or a write
    failed. `cpu`: (the server's HostCpu, whether the compute ran on the host), or None."""
    from ..trace import analysis
    status = 0 if outcomes.answered else 1
    try:
        _write_trace(out, events)
    except OSError as e:  # (disk full)
        print_err(f"aclserve profile: error: cannot write {out}: {e.strerror or e}")
        out, status = "not written", 1
    print_out(f"{args.model}: {outcomes.answered_in()}, {counted(args.clients, 'client')}, {args.rows} row(s) each; "
              f"trace: {out}")
    if outcomes.refused:
        print_out(f"refused: {outcomes.refusals()}")
    if outcomes.cut:
        print_out(outcomes.cut_short(args.seconds))
    # (the requests cut left out, which the server may have answered once their client had gone: the trace keeps them)
    kept = analysis.without_requests(events, {request_id(number) for number in outcomes.cut_numbers})
    print_out(analysis.format_summary(analysis.summarize(kept, *(cpu or ()))))
    if args.png:
        status = max(status, _draw(args, events))
    if not outcomes.answered:
        print_err(f"aclserve profile: error: {_none_answered(args, outcomes)}")
    return status


def _none_answered(args, outcomes) -> str:
    """Why the run answered nothing: `--clients 100000` sent nothing in a short run (the clients
    take seconds to start) and blamed the trace folder, where the server had nothing to write."""
    if outcomes.cut:  # (a request that takes longer than the run and its drain)
        return (f"no request was answered within the run's {args.seconds:g} s (--seconds) and {DRAIN_S:g} s past "
                f"it, and {outcomes.cut:,} in flight then were cancelled; give more --seconds or fewer --clients")
    if outcomes.sent:
        return "no request was answered"
    return (f"no request was sent: the run's {args.seconds:g} s (--seconds) were over before any of its "
            f"{args.clients:,} clients had started; give fewer --clients or more --seconds")


def _write_trace(out: str, events: list[dict]) -> None:
    import orjson
    with _written_whole(out) as f:
        f.write(orjson.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))


@contextlib.contextmanager
def _written_whole(path: str):
    """`path` opened to be written (binary), removed when writing it fails: a full disk left a
    0-byte trace that looked like one (a tester, t87), where `aclserve compile` leaves no partial
    OM. Only a regular file it opened goes: not /dev/full, nor a link or what it leads to."""
    f = open(path, "wb")  # (an open that fails removes nothing: the file is not this run's)
    regular = False
    try:
        regular = stat.S_ISREG(os.fstat(f.fileno()).st_mode) and not os.path.islink(path)
        with f:
            yield f
    except BaseException:
        with contextlib.suppress(OSError):
            f.close()  # (closed already, but for a failure before the block)
        if regular:
            with contextlib.suppress(OSError):
                os.remove(path)
        raise


def _draw(args, events: list[dict]) -> int:
    from ..trace.plot import render_png
    if not any(e.get("ph") == "X" for e in events):
        print_out("timeline: not drawn (the trace has no spans)")
        return 0
    try:
        render_png(events, args.png, args.png_window_ms)
    except OSError as e:
        print_err(f"aclserve profile: error: cannot write {args.png}: {e.strerror or e}")
        return 1
    print_out(f"timeline: {args.png} ({args.png_window_ms:g} ms window)")
    return 0


MAX_INPUT_BYTES = 1 << 30  # one input's random values; a model's largest gear is far below
SMALL_INTEGERS = (0, 9)  # an integer input with no value range: counts, indices, flags all take these


def _random_values(rng, datatype: str, dims: list[int], value_range: tuple[int, int] | None) -> np.ndarray:
    """Floats from a standard normal; an integer input's within its `value_range` (the model's:
    a negative draw was an index the model refuses, and wrapped to a huge one in a UINT input),
    else 0..9 (at most what its type holds); BOOL inputs both values."""
    from ..dtypes import kserve_to_numpy
    dtype = kserve_to_numpy(datatype)
    if dtype.kind == "b":
        return rng.integers(0, 1, dims, endpoint=True).astype(dtype)
    if dtype.kind not in "iu":
        return rng.standard_normal(dims).astype(dtype)
    held = np.iinfo(dtype)
    low, high = value_range if value_range is not None else SMALL_INTEGERS
    low, high = max(low, held.min), min(high, held.max)  # (a remote server's metadata, taken as it says)
    if low > high:
        low, high = SMALL_INTEGERS[0], min(SMALL_INTEGERS[1], held.max)
    return rng.integers(low, high, dims, dtype=dtype, endpoint=True)


def _body(inputs_meta: list[tuple[str, str, list[int]]], rows: int, max_rows: int = 0,
          value_ranges: Mapping[str, tuple[int, int]] | None = None) -> tuple[bytes, int]:
    """Random values for every input, `rows` rows; `max_rows`: the model's max_batch_size when
    known (0: a static batch or not known), checked before anything is made; `value_ranges`:
    {integer input: (smallest, largest)} the model takes, as its metadata gives them."""
    from .infer import build_request
    if 0 < max_rows < rows:  # (the server refuses it too, after up to 1 GiB an input was made)
        raise UsageError(f"--rows {rows} exceeds the model's max_batch_size, {max_rows}")
    rng = np.random.default_rng(0)
    arrays = {}
    for name, datatype, shape in inputs_meta:
        if datatype == "BYTES":
            raise UsageError(f"input {name!r} takes encoded images (BYTES): profile sends random tensors, so it "
                             f"profiles models with numeric inputs only")
        if rows > 1 and (not shape or shape[0] != -1):  # (the rows were ignored, yet reported)
            first = shape[0] if shape else "none (a scalar)"
            raise UsageError(f"--rows {rows}: input {name!r} has a fixed first dimension, {first} (a static batch); "
                             f"profile it with --rows 1")
        dims = [rows if (i == 0 and d == -1) else max(d, 1) for i, d in enumerate(shape)]
        size = math.prod(dims) * 8  # (drawn as float64 first)
        if size > MAX_INPUT_BYTES:  # (a traceback of numpy's MemoryError, after allocating what it could)
            raise UsageError(f"--rows {rows}: input {name!r} would take {size:,} bytes to make; at most "
                             f"{MAX_INPUT_BYTES:,} (ask for fewer rows)")
        arrays[name] = _random_values(rng, datatype, dims, (value_ranges or {}).get(name))
    return build_request(arrays, [])


async def _in_process(args):
    from ..app import build_repository, build_runtime
    from ..config import load_server_config
    from ..trace import chrome
    from ..trace.host_cpu import CpuMeter
    from ..server.infer_pipeline import counted_infer
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
        state = ServerState(config, repo, runtime)  # (its checks, the API token's, before any model loads)
        await repo.start(only=args.model)  # (the folder's other models are not loaded: nothing of theirs is asked)
        state.started = True
        try:
            served = repo.get(args.model)
        except Exception as e:  # (the repository's messages name the model)
            folder = [row["name"] for row in repo.index()]
            held = "" if args.model in folder else models_hint(folder, "in the models folder")
            raise UsageError(f"{getattr(e, 'message', e)}{held}") from None
        meta = [(s.name, s.datatype, list(s.shape)) for s in served.inputs]
        ranges = {name: (r.low, r.high) for name, r in served.value_ranges.items()}
        body, header_length = _body(meta, args.rows, served.max_batch_size, ranges)
        work = functools.partial(_work, body, header_length, None)

        async def one(number: int) -> str | None:
            named = request_id(number)  # (its trace is left out of the summary if it is cut)
            try:
                await counted_infer(state, args.model, None, functools.partial(_work, body, header_length, named),
                                    protocol="inproc", known_id=named)
            except ServeError as e:  # (more clients than the queue holds, or their rows: QueueFull)
                return type(e).__name__
            return None
        try:  # one request first: what the model refuses (too many rows, say) is one line
            await counted_infer(state, args.model, None, work, protocol="inproc")
        except ServeError as e:
            raise UsageError(f"model {args.model!r} refused the request: {e.message}") from None
        warm = await warm_up(args.clients, args.seconds, one)  # not traced below
        state.tracer.take()
        traces = []

        async def drain():  # the tracer keeps at most MAX_PENDING: collect them as they come
            while True:
                await asyncio.sleep(0.2)
                traces.extend(state.tracer.take())
        drainer = asyncio.ensure_future(drain())
        meter = CpuMeter()  # (on the event loop's thread: its CPU is told apart by it)
        try:
            outcomes = await closed_loop(args.clients, args.seconds, one)
        finally:
            drainer.cancel()
        outcomes.warm_up = warm
        host = meter.stop()
        traces.extend(state.tracer.take())
        return chrome.events(traces), outcomes, (host, runtime.kind == "cpu")
    finally:
        await repo.close()
        runtime.close()


async def _work(body, header_length, named, rec, trace):
    from ..server.infer_pipeline import infer_body
    return await infer_body(rec, body, header_length, trace, named)
