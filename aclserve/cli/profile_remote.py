"""`aclserve profile --url`: the closed loop against a running server, with the model's tracing
turned on into profile-MODEL.json inside the server's trace folder for the run, read back from
--trace-dir (the server must share this machine's filesystem) and removed there, and the model's
own trace settings put back (written as they will be put back before any load, so a server that
refuses the changes, an API token missing, is found then). One name per model: the server takes a
bounded number of trace_file names (trace/names.py MAX_NAMES), so a name per run stopped every
profile after 1,024 runs.

A run interrupted (Ctrl-C, SIGTERM, SIGHUP: its main task cancelled, termination.py) or failed once
tracing is on still turns it off and puts the settings back, and removes the file the server writes
for the requests it traced (once they are answered); a file it cannot remove (not written in time,
a second Ctrl-C or SIGTERM, a --trace-dir that is not the server's folder) is named in one line.
A server that goes away during the run (a connection refused) ends it at once (ServerGone), its
settings and file left alone."""
from __future__ import annotations

import asyncio
import errno
import json
import os
import time

from ..server.observe import REQUEST_ID_HEADER
from ..quoting import counted
from .load import Outcomes, closed_loop, request_id, warm_up
from .output import print_err
from .remote import auth_headers, kserve_error, token_hint
from .usage import NotKServe, UsageError, models_hint, one_line

CONTROL_CONNECTIONS = 4  # metadata and trace settings, beside the clients' own connections
WRITE_WAIT_S = 30.0  # for the server to write the trace file once tracing is off
AFTER_RUN_S = 10.0  # a trace setting after the run tried again so long while the server refuses its connection
AFTER_RUN_PAUSE_S = 0.1  # between those tries
# A connection that cannot be made for one of these ends the run at once: nothing listens at the port (or no route
# reaches its host) any more, where it answered the set-up. A busy server does not refuse connections (a full listen
# backlog drops them: a timeout, counted as a refusal, as its 503s and 429s are), and each later try fails at once
# too, so counting them spun the clients for the rest of --seconds (63 % of a core for 6 minutes, orphaned); a server
# back from a restart would serve a run whose figures mix two servers. Other connect failures (EMFILE: more --clients
# than this process may open files) are counted as refusals, as before: the server is still there.
GONE_ERRNOS = (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH)


class TraceUnreadable(ValueError):
    """The trace file the server wrote cannot be read as a Chrome trace."""


class ServerGone(Exception):
    """The server stopped answering during the run (a connection to it refused): exit status 1."""


class ServerRefused(Exception):
    """The server answered a request of the set-up with its error (no such model, say): exit
    status 1, as `aclserve infer` has for the server's errors."""


class Redirected(Exception):
    """The server answered a redirect, which is not followed (remote.redirect_refused): exit status 1."""

    def __init__(self, status: int, location: str | None):
        super().__init__(status, location)
        self.status, self.location = status, location


async def _refuse_redirect(session, context, params) -> None:
    """aiohttp follows redirects unless each request says not to; this hook of the session runs
    before it would, for every request the run makes: a 307 elsewhere had the target asked for
    the model's metadata and the repository index (aiohttp drops the token only on a change of
    host or port, and the target learnt the model's name either way)."""
    params.response.close()
    raise Redirected(params.response.status, params.response.headers.get("Location"))


def _no_redirects():
    import aiohttp
    config = aiohttp.TraceConfig()
    config.on_request_redirect.append(_refuse_redirect)
    return config


async def _said(resp) -> str:
    """What an answer that is not 200 says, in one line: its JSON error, else its first line."""
    text = await resp.text(errors="replace")
    try:
        text = json.loads(text)["error"]
    except (ValueError, RecursionError, KeyError, TypeError):
        pass
    return f"HTTP {resp.status}: {one_line(text)}{token_hint(resp.status)}"


async def _refusal(resp, doing: str = "") -> Exception:
    """The error to raise for an answer that is not 200: ServerRefused with the server's message,
    after `doing` ("could not turn tracing on: "), or NotKServe when it is no KServe v2 error."""
    text = await resp.text(errors="replace")
    message = kserve_error(text)
    if message is None:  # (a web server's HTML page)
        return NotKServe(f"HTTP {resp.status}: {one_line(text) or resp.reason}{token_hint(resp.status)}")
    return ServerRefused(f"{doing}HTTP {resp.status}: {one_line(message)}{token_hint(resp.status)}")


async def _models_ready(session, base: str) -> str:
    """models_hint of the server's repository index, or "" when it has none to read."""
    import aiohttp
    try:
        async with session.post(f"{base}/v2/repository/index", json={"ready": True}) as resp:
            rows = await resp.json(content_type=None) if resp.status == 200 else None
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return ""
    if not isinstance(rows, list):
        return ""
    return models_hint(row["name"] for row in rows if isinstance(row, dict) and isinstance(row.get("name"), str))


def _inputs(doc) -> list[tuple[str, str, list[int]]]:
    """The (name, datatype, shape) of each input the metadata lists; NotKServe when it lists none."""
    inputs = doc.get("inputs") if isinstance(doc, dict) else None
    try:
        meta = [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in inputs]
    except (KeyError, TypeError, ValueError):
        meta = None
    if not meta or not all(isinstance(n, str) and isinstance(d, str) for n, d, _ in meta):
        raise NotKServe("its model metadata has no list of inputs (name, datatype, shape)")
    return meta


def _value_ranges(doc) -> dict[str, tuple[int, int]]:
    """{input: (smallest, largest)} of the inputs whose metadata gives a `value_range` parameter
    (server/model_info.py); one not two integers is passed over (the values then are small ones)."""
    ranges = {}
    for tensor in doc["inputs"]:  # (_inputs checked each is a dict with a name)
        parameters = tensor.get("parameters")
        given = parameters.get("value_range") if isinstance(parameters, dict) else None
        if isinstance(given, list) and len(given) == 2 and all(type(v) is int for v in given) and given[0] <= given[1]:
            ranges[tensor["name"]] = (given[0], given[1])
    return ranges


async def _max_batch_size(session, base: str, model: str) -> int:
    """The model configuration's max_batch_size, or 0 when it cannot be read (the server then
    judges the rows itself)."""
    async with session.get(f"{base}/v2/models/{model}/config") as resp:
        try:
            value = (await resp.json(content_type=None)).get("max_batch_size") if resp.status == 200 else 0
        except (ValueError, RecursionError, AttributeError):
            value = 0
    return value if type(value) is int and value > 0 else 0


async def _own_trace_settings(session, base: str, setting: str) -> dict:
    """The model's trace settings as an update that puts them back: each one that differs from
    the global one (the model set it), and null for the rest (they follow the global ones).
    A setting the model set to the global value comes back following it. ServerRefused when
    they cannot be read (an empty update would clear the model's own settings)."""
    readings = []
    for url in (setting, f"{base}/v2/trace/setting"):
        async with session.get(url) as resp:
            if resp.status != 200:
                raise await _refusal(resp, "could not read the trace settings: ")
            try:
                readings.append(await resp.json(content_type=None))
            except (ValueError, RecursionError) as e:
                raise NotKServe(f"its trace settings are not JSON ({one_line(e)})") from None
    own, shared = (d if isinstance(d, dict) else {} for d in readings)
    return {key: (value if value != shared.get(key) else None) for key, value in own.items()}


async def _settings_taken(session, setting: str, restore: dict) -> None:
    """Write the model's trace settings as the run puts them back (`restore`: so nothing changes),
    before any load: a server that refuses this run's changes of them (no API token, a wrong
    one) is found now, in one line, and not after a warm-up, with a put-back to fail after."""
    async with session.post(setting, json=restore) as resp:
        if resp.status != 200:
            raise await _refusal(resp, "could not change the model's trace settings: ")


def _remove_stale(path: str) -> None:
    """A file left by an earlier run must not pass for this run's (found again by mtime below)."""
    try:
        os.remove(path)
    except OSError:
        pass


def answered_so_far(answered: int, run_from: int, warm: Outcomes | None) -> str:
    """What a ServerGone says was answered of `answered` (the warm-up's and the run's): the run's, from `run_from`
    on, with the warm-up's apart as the summary line says them, or, before the warm-up ends (`warm`: its outcomes,
    once it is over), the warm-up's (the first request, answered alone before it, one of them)."""
    if warm is None:
        return f"{counted(answered + 1, 'request')} answered in the warm-up, before the run"
    return f"{counted(answered - run_from, 'request')} answered ({warm.as_warm_up()})"


async def run_remote(args, make_body, tls=None):
    """(trace events, outcomes, None): the process CPU time of a remote server is not known.
    `tls`: the SSLContext showing the client certificate, if any."""
    import aiohttp

    base = args.url.rstrip("/")
    name = f"profile-{args.model}.json"
    path = os.path.join(args.trace_dir, name)
    setting = f"{base}/v2/models/{args.model}/trace/setting"
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=args.timeout, sock_read=args.timeout)
    # (the default limit, 100, capped --clients)
    connector = aiohttp.TCPConnector(limit=args.clients + CONTROL_CONNECTIONS, ssl=tls or True)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=auth_headers(),
                                     trace_configs=[_no_redirects()]) as session:
        async with session.get(f"{base}/v2/models/{args.model}") as resp:
            if resp.status != 200:
                refusal = await _refusal(resp)
                if resp.status == 404 and isinstance(refusal, ServerRefused):  # (its message names the model)
                    raise ServerRefused(f"{refusal}{await _models_ready(session, base)}")
                raise refusal
            try:
                doc = await resp.json(content_type=None)
            except (ValueError, RecursionError) as e:  # (HTML, say; or JSON nested past the stack)
                raise NotKServe(f"its model metadata is not JSON ({one_line(e)})") from None
        meta = _inputs(doc)
        body, header_length = make_body(meta, args.rows, await _max_batch_size(session, base, args.model),
                                        _value_ranges(doc))
        restore = await _own_trace_settings(session, base, setting)
        await _settings_taken(session, setting, restore)
        headers = {"Inference-Header-Content-Length": str(header_length), "Content-Type": "application/octet-stream"}
        url = f"{base}/v2/models/{args.model}/infer"

        # requests sent (the server writes a trace file if any was traced) and answered, the warm-up's included
        sent = answered = 0
        warm, run_from = None, 0  # the warm-up's outcomes, once it is over, and `answered` then
        gone = None  # the ServerGone that ended the run: nothing more is asked of the server

        async def one(number: int) -> str | None:
            nonlocal sent, answered, gone
            sent += 1
            try:  # (named: its trace is left out of the summary if it is cut)
                async with session.post(url, data=body, headers={**headers, REQUEST_ID_HEADER: request_id(number)}
                                        ) as resp:
                    await resp.read()
                    answered += resp.status == 200
                    return None if resp.status == 200 else f"HTTP {resp.status}"
            except asyncio.TimeoutError:  # (aiohttp's timeouts are ClientErrors too)
                return f"no answer within {args.timeout:g} s"
            except aiohttp.ClientConnectorError as e:
                if e.os_error.errno not in GONE_ERRNOS:
                    return type(e).__name__
                gone = gone or ServerGone(f"the server at {args.url} stopped answering "
                                          f"({os.strerror(e.os_error.errno).lower()}) after "
                                          f"{answered_so_far(answered, run_from, warm)}")
                raise gone from None
            except aiohttp.ClientError as e:
                return type(e).__name__
        async with session.post(url, data=body, headers=headers) as resp:  # what it refuses is one line
            if resp.status != 200:
                raise await _refusal(resp, f"model {args.model!r} refused the request: ")
        warm = await warm_up(args.clients, args.seconds, one)  # untraced
        run_from = answered
        _remove_stale(path)
        traced_from, untraced, off = time.time(), sent, False
        maybe_on = True  # (the request turning it on too: interrupted in flight, the server may have taken it)
        try:
            try:
                refused = await _trace_on(session, setting, name)
                if refused is not None:  # answered with its error: nothing changed, nothing to put back
                    maybe_on = False
                    raise refused
                _has_trace_dir(args.trace_dir)
                outcomes = await closed_loop(args.clients, args.seconds, one)
                outcomes.warm_up = warm
            finally:
                if gone is None and maybe_on:  # (a server gone would refuse these too: a second error)
                    await _set_after_run(session, setting, {"trace_level": ["OFF"]})  # tracing OFF writes the file
                    off = True
                    await _put_back(session, setting, restore)
        except BaseException:  # interrupted or failed: what the server writes for it is not left behind
            if off and sent > untraced:  # (a server that went away writes nothing to wait for)
                await _take_back(path, traced_from)
            raise
    if sent == untraced:  # (the run was over before its clients started: the server traced nothing, writes nothing)
        return [], outcomes, None
    try:
        written = await _written_since(path, traced_from)
    except asyncio.CancelledError:  # (interrupted while waiting for it)
        _say_left(path)
        raise
    if not written:
        raise UsageError(f"the server did not write {path} (is --trace-dir its trace folder?); it writes this "
                         f"run's trace as {name} in its own trace folder (its trace_dir): remove it there")
    events = read_trace(path)
    _remove_stale(path)  # read: the client writes its own copy (--trace); each run left up to 24 MB
    return events, outcomes, None


async def _trace_on(session, setting: str, name: str) -> Exception | None:
    """Turn the model's tracing on into `name`: None, or the error to raise when the server
    answered with its own (then it changed nothing)."""
    async with session.post(setting, json={"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1",
                                           "log_frequency": "0", "trace_file": name,
                                           "trace_format": "chrome"}) as resp:
        return None if resp.status == 200 else await _refusal(resp, "could not turn tracing on: ")


def _has_trace_dir(trace_dir: str) -> None:
    if not os.path.isdir(trace_dir):  # the server has its folder for the name now: found out before any trace
        raise UsageError(f"--trace-dir {trace_dir}: no such folder here; it must be the server's trace folder "
                         "(its trace_dir), as seen from this machine")


async def _put_back(session, setting: str, restore: dict) -> None:
    said = await _set_after_run(session, setting, restore)  # the model's own as they were
    if said is not None:
        print_err(f"aclserve profile: warning: could not put the model's trace settings back "
                  f"({said}); to do so, POST this to {setting}: {json.dumps(restore)}")


async def _set_after_run(session, setting: str, payload: dict) -> str | None:
    """POST `payload` to the trace `setting` once the run is over: None when answered 200, else what
    the answer said. The requests the run cut closed their connections, which a server at its
    max_connections may not have seen close yet: it refuses a new one (closed at once, or answered
    503), so the POST was said to break off the exchange; tried again for AFTER_RUN_S so."""
    import aiohttp
    deadline = time.monotonic() + AFTER_RUN_S
    while True:
        try:
            async with session.post(setting, json=payload) as resp:
                if resp.status != 503 or time.monotonic() >= deadline:
                    return None if resp.status == 200 else await _said(resp)
                await resp.read()
        except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as e:
            gone = isinstance(e, aiohttp.ClientConnectorError) and e.os_error.errno in GONE_ERRNOS
            if gone or time.monotonic() >= deadline:
                raise
        await asyncio.sleep(AFTER_RUN_PAUSE_S)


async def _take_back(path: str, since: float) -> None:
    """Remove the file the server writes for a run that failed or was interrupted, once it is
    written (its requests in flight answered); said in one line when it is not in WRITE_WAIT_S or
    a second Ctrl-C ends the wait."""
    written = False
    try:
        written = await _written_since(path, since)
    finally:
        if written:
            _remove_stale(path)
        else:
            _say_left(path)


def _say_left(path: str) -> None:
    print_err(f"aclserve profile: the server's trace of this run is left (once written): {path}, or "
              f"{os.path.basename(path)} in the server's own trace folder if --trace-dir is not it")


async def _written_since(path: str, since: float) -> bool:
    """Whether the server wrote `path` since `since` within WRITE_WAIT_S."""
    deadline = time.monotonic() + WRITE_WAIT_S
    while time.monotonic() < deadline:
        try:
            if os.stat(path).st_mtime >= since:
                return True
        except OSError:
            pass
        await asyncio.sleep(0.1)
    return False


def read_trace(path: str) -> list[dict]:
    """The events of a Chrome trace file; TraceUnreadable naming the file when it is not one."""
    import orjson
    from ..trace.analysis import malformed

    try:
        with open(path, "rb") as f:
            doc = orjson.loads(f.read())
    except OSError as e:
        raise TraceUnreadable(f"cannot read the trace file {path}: {e.strerror or e}") from None
    except orjson.JSONDecodeError as e:
        raise TraceUnreadable(f"the trace file {path} is not JSON ({one_line(e)})") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise TraceUnreadable(f"the trace file {path} is not a Chrome trace (no traceEvents list)")
    problem = malformed(events)
    if problem:
        raise TraceUnreadable(f"the trace file {path} is not a trace aclserve reads: {problem}")
    return events
