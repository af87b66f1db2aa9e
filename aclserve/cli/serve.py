"""`aclserve serve`: the configuration from file and flags, logging, then the server's run."""
from __future__ import annotations

import argparse
import asyncio
import logging
import pathlib
import signal

from .usage import FILE_NAME, FOLDER_NAME, UsageError


def add_commands(sub) -> None:
    p = sub.add_parser("serve", help="run the KServe v2 HTTP and gRPC server",
                       description="Serve the models of a repository folder over the KServe v2 protocol. "
                                   "Options given here override the config file, which overrides the "
                                   "embedded default (aclserve/configs/default.yaml). SIGTERM, SIGINT and "
                                   "SIGHUP stop it alike, while it starts too: it drains (up to "
                                   "shutdown_timeout_s) and exits 0; "
                                   "a second signal ends the drain at once. SIGHUP is no reload (models "
                                   "reload from their folder): a systemd ExecReload=kill -HUP stops it. A "
                                   "device that fails as a whole (an HBM ECC error, say) makes it drain and "
                                   "exit 75, for its supervisor to restart it.")
    p.add_argument("--config", metavar="FILE", type=FILE_NAME, help="YAML config merged over the embedded default")
    p.add_argument("--models", metavar="DIR", type=FOLDER_NAME, help="model repository folder (models_dir)")
    p.add_argument("--host", help="address to listen on (default 127.0.0.1; 0.0.0.0 to expose it over IPv4, "
                                        ":: over IPv6 and IPv4)")
    p.add_argument("--port", type=int, help="TCP port (default 8000; 0 = any free port)")
    p.add_argument("--grpc-port", type=int, metavar="PORT",
                   help="TCP port of the KServe v2 gRPC endpoint (default 8001; 0 = no gRPC)")
    p.add_argument("--compile-cache-dir", metavar="DIR", type=FOLDER_NAME,
                   help="where dropped .onnx files are compiled to (default <models>/.cache)")
    p.add_argument("--device", type=str.lower, choices=("auto", "cpu", "npu"), help="ACL to use (default auto)")
    p.add_argument("--log-level", type=str.lower, choices=("debug", "info", "warning", "error", "critical"),
                   help="logging level (default info; debug adds aiohttp's access log, a line per HTTP "
                        "request aiohttp answers, and turns the direct infer answers off for it; gRPC calls "
                        "are not in it: --request-log logs the infer requests of both transports)")
    p.add_argument("--tls-cert", metavar="FILE", type=FILE_NAME,
                   help="PEM certificate chain: serve HTTPS and gRPC over TLS (tls_cert_file; with --tls-key)")
    p.add_argument("--tls-key", metavar="FILE", type=FILE_NAME, help="its PEM private key (tls_key_file)")
    p.add_argument("--tls-client-ca", metavar="FILE", type=FILE_NAME,
                   help="PEM CA certificates: clients must show a certificate signed by one (tls_client_ca_file; "
                        "with --tls-cert)")
    p.add_argument("--cpu-threads", type=int, metavar="N",
                   help="ONNX Runtime threads per instance (CPU runtime; default 1)")
    p.add_argument("--model-control-mode", type=str.lower, choices=("poll", "explicit", "none"),
                   help="how the repository follows the models folder (default poll)")
    p.add_argument("--readiness", type=str.lower, choices=("strict", "lenient"),
                   help="/v2/health/ready: strict (default) waits for every model in the folder, "
                        "lenient ignores refused ones (but needs one serving) and, once ready, models added later")
    p.add_argument("--max-batch", type=int, metavar="N",
                   help="largest batch formed, and most rows a request may have (more: 400), for a model "
                        "without its own setting (model_defaults.batching.max_batch_size; default 0: the "
                        "largest compiled gear)")
    p.add_argument("--max-delay-ms", type=float, metavar="MS",
                   help="queue delay for partial batches of a model without its own setting "
                        "(model_defaults.batching.max_queue_delay_ms; default 1.0)")
    p.add_argument("--log-format", type=str.lower, choices=("text", "json"),
                   help="log lines as text or one JSON object per line")
    p.add_argument("--request-log", action=argparse.BooleanOptionalAction, default=None,
                   help="log one line per infer request (request id, model, version, status, durations); "
                        "--no-request-log: none, whatever the config file's request_log says")
    p.add_argument("--trace", metavar="FILE", type=FILE_NAME,
                   help="trace requests to FILE (Chrome trace / Perfetto JSON; written at shutdown, "
                        "or every --trace-log-frequency traces)")
    p.add_argument("--trace-rate", type=int, metavar="N", help="trace one request in N (default 1000)")
    p.add_argument("--trace-count", type=int, metavar="N", help="stop after N traces (default -1: never)")
    p.add_argument("--trace-log-frequency", type=int, metavar="N",
                   help="write the trace file every N traces, to FILE.0, FILE.1, ... (default 0: at shutdown)")
    p.add_argument("--trace-format", type=str.lower, choices=("chrome", "triton"),
                   help="trace file format (default chrome)")
    p.set_defaults(func=run_serve)


QUIET_LOGGERS = ("watchdog", "asyncio", "grpc", "PIL", "urllib3")


# the flag setting each config key (an error about settings that do not go together names it: origins.py)
SERVE_FLAGS = {"host": "--host", "port": "--port", "grpc_port": "--grpc-port", "models_dir": "--models",
               "compile_cache_dir": "--compile-cache-dir", "device": "--device", "log_level": "--log-level",
               "cpu_threads": "--cpu-threads", "tls_cert_file": "--tls-cert", "tls_key_file": "--tls-key",
               "tls_client_ca_file": "--tls-client-ca", "model_control_mode": "--model-control-mode",
               "readiness": "--readiness", "model_defaults.batching.max_batch_size": "--max-batch",
               "model_defaults.batching.max_queue_delay_ms": "--max-delay-ms", "log_format": "--log-format",
               "request_log": "--request-log", "trace.file": "--trace", "trace.level": "--trace",
               "trace.rate": "--trace-rate", "trace.count": "--trace-count",
               "trace.log_frequency": "--trace-log-frequency", "trace.format": "--trace-format"}


def serve_overrides(args) -> dict:
    """The config keys the flags given set ({key: value}; None for a flag not given)."""
    values = {key: _given(args, flag) for key, flag in SERVE_FLAGS.items()}
    values["trace.level"] = "TIMESTAMPS" if args.trace else None
    return values


def serve_flags(args) -> dict[str, str]:
    """SERVE_FLAGS as typed: a switch given as its negative form (`--no-request-log`, the only
    value a flag sets to False) is named so where its origin is said, not as `--request-log`."""
    return {key: f"--no-{flag[2:]}" if _given(args, flag) is False else flag for key, flag in SERVE_FLAGS.items()}


def _given(args, flag: str):
    return getattr(args, flag[2:].replace("-", "_"))


def run_serve(args) -> int:
    import os
    # grpc core logs to stderr past the server's log settings (a client's failed TLS handshake is
    # an INFO line): its errors only, unless the environment says otherwise; set before grpc loads
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    from .. import logs
    try:
        config, origins = _checked_settings(args)
    except UsageError:  # stopped before logging is set up: in JSON too where the flag or the file asks for it
        if _log_format_known(args) == "json":
            logs.configure("info", "json")
            logs.stop_queue()  # (the reason is written at once, in the thread that says it: cli main)
        raise
    from .stderr_relay import relay_for_logs
    # fd 2 a pipe drained into the log's queue from now on (before grpc and ONNX Runtime run): what native
    # code writes there waits for no stderr reader (stderr_relay.py)
    relay = relay_for_logs(config.log_level, config.log_format)
    try:
        _check_descriptor_limit(config)
        return _serve_logged(args, config, origins)
    finally:  # the queued lines out before the reason the server stopped (cli main), in order after them
        if relay is not None:
            relay.close()  # (the pipe's last lines onto the queue; fd 2 the real stderr again)
        logs.stop_queue()


def _checked_settings(args):
    """The config and its origins (config.load_server_settings), the environment and the trace
    file's folder checked: UsageError for the first thing wrong."""
    from ..config import ConfigError, load_server_settings
    try:
        config, origins = load_server_settings(args.config, serve_overrides(args), serve_flags(args))
    except (ConfigError, OSError) as e:
        raise UsageError(f"bad configuration: {e}") from None
    check_environment()
    if config.trace.file:
        _check_trace_folder(config.trace.file, config.trace.log_frequency)
    return config, origins


def _log_format_known(args) -> str:
    """The log format `--log-format` gives, else the config file's `log_format` when the file
    can be read and says one (whatever else is wrong in it), else text: the format of the error a
    start stops with before its settings are all read. A file that is not a regular one is not
    opened again: a pipe's text was read already, and opening a FIFO waits for a writer."""
    if args.log_format:
        return args.log_format
    if args.config:
        from ..config.files import read_yaml
        from ..logs import FORMATS
        try:
            value = read_yaml(args.config, regular_only=True).get("log_format")
        except Exception:  # noqa: BLE001 - a file that cannot be read, or read as a mapping, says no format
            return "text"
        if isinstance(value, str) and value.lower() in FORMATS:
            return value.lower()
    return "text"


def _serve_logged(args, config, origins) -> int:
    """run_serve once logging is configured; `origins`: where each setting of `config` came from."""
    from ..app import serve  # the composition root: builds the runtime, repository and servers
    from ..config import ConfigError
    from .. import logs
    if config.request_log:  # the request log speaks at info whatever the level of the rest
        logging.getLogger(logs.REQUEST_LOGGER).setLevel(logging.INFO)
    _say_config_file(args.config, origins)
    from .environment import warn_unknown
    warn_unknown()
    _note_trace_settings_unused(args, config)
    _note_threads_variable_ignored(config)
    for noisy in QUIET_LOGGERS:  # --log-level debug is about aclserve, not every inotify event
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    from .. import heap
    heap.limit_arenas()  # before any worker thread: reloads then give their memory back
    from .. import collector
    collector.tune_for_server()  # fewer young collections: about 10 % of a light request's CPU
    from .. import thread_policy
    thread_policy.apply(config.thread_scheduling)  # before any other thread: they inherit it
    from ..acl import AclUnavailable
    from ..repository import RepositoryError, check_models_folder
    from .. import startup_signals
    try:
        check_models_folder(pathlib.Path(config.models_dir))  # (before the endpoints listen, not after)
        asked = startup_signals.asked()  # (serve's loop takes what comes after, once it has its handlers)
        if asked is not None:  # a stop signal received so far: nothing has started that it would stop
            startup_signals.take()
            startup_signals.say_stopped(asked)
            _exiting()
            return 0
        status = _run(serve(config))  # 0, or server/app.py's EXIT_DEVICE_FAILED
        _exiting()
    except ConfigError as e:  # found as the server is built (the TLS files, the API token): named as the loader's
        raise UsageError(f"bad configuration: {origins.blamed(e)}") from None
    except AclUnavailable as e:  # npu asked, no CANN: by the device setting (where it came from) or ACLSERVE_DEVICE
        raise UsageError(str(_npu_named(e, origins.of("device")))) from None
    except RepositoryError as e:
        raise UsageError(str(e)) from None
    except OSError as e:  # a port taken (the listeners name it), a folder that cannot be read or made
        raise UsageError(str(e)) from None
    return status


def _npu_named(error, origin: str):
    """`error` (AclUnavailable) naming what asked for the npu when the device setting did: `origin`,
    its flag (--device) or its file's path, not "device, --device or ACLSERVE_DEVICE"."""
    from ..acl import npu_missing
    if not error.by_setting:
        return error
    return npu_missing(origin if origin.startswith("--") else f"device in {origin}", True)


def _check_descriptor_limit(config) -> None:
    """Under descriptors.MIN_DESCRIPTORS (once raised as far as the hard limit lets it), one line
    now, before anything opens: the start failed wherever descriptors ran out, naming something else."""
    from ..server.descriptors import connections_wanted, short_of_descriptors
    short = short_of_descriptors(sum(connections_wanted(config)))
    if short:
        raise UsageError(short)


def _say_config_file(path: str | None, origins) -> None:
    """One INFO line naming the config file read (as given), and each of its keys a flag or an
    environment variable replaced, with where the value came from: never a value (one is the token)."""
    import os
    from ..secret_env import TOKEN_ENV
    if path is None:
        return
    replaced = origins.replaced()
    if os.environ.get(TOKEN_ENV) and origins.of("api_token") == path:  # (Access takes the variable's)
        replaced["api_token"] = [TOKEN_ENV]
    said = "; ".join(f"{key} from {' and '.join(sources)}" for key, sources in replaced.items())
    logging.getLogger(__name__).info("config file %s read%s", path, f", its settings replaced: {said}" if said else "")


def _note_trace_settings_unused(args, config) -> None:
    """--trace-rate and its kin while tracing is off at start trace nothing until the trace API
    turns it on: said once, not silently taken."""
    given = [flag for flag, value in (("--trace-rate", args.trace_rate), ("--trace-count", args.trace_count),
                                      ("--trace-log-frequency", args.trace_log_frequency),
                                      ("--trace-format", args.trace_format)) if value is not None]
    if given and (config.trace.level == "OFF" or not config.trace.file):
        logging.getLogger(__name__).warning(
            "%s given, but tracing is off (no --trace): nothing is traced until the trace API turns "
            "it on (trace_level TIMESTAMPS and a trace_file)", ", ".join(given))


def _note_threads_variable_ignored(config) -> None:
    """ACLSERVE_CPU_THREADS is the Python API's default; serve runs its cpu_threads setting's."""
    import os
    given = os.environ.get("ACLSERVE_CPU_THREADS", "").strip()
    if given:
        logging.getLogger(__name__).warning(
            "ACLSERVE_CPU_THREADS=%r is ignored: aclserve serve runs %d ONNX Runtime thread(s) per model on the "
            "CPU runtime, its cpu_threads setting (--cpu-threads)", given, config.cpu_threads)


def _check_trace_folder(path: str, log_frequency: int = 0) -> None:
    """The trace file's folder is made and written to now: the traces are written at shutdown (or
    every --trace-log-frequency), too late to say that they cannot be. With a log_frequency the
    files are path.0, path.1, ... beside `path`, which may then be a folder (as the tracer takes)."""
    import os
    import tempfile
    from pathlib import Path
    from ..trace.files import blocked_by
    target = Path(os.path.abspath(path))
    try:
        blocker = blocked_by(target, indexed=log_frequency > 0)
    except OSError as e:  # a name too long, a folder of it unreadable
        raise UsageError(f"cannot write the trace file {path}: {e.strerror or e}") from None
    if blocker == target:  # the write at shutdown failed "Is a directory": the traces were lost
        raise UsageError(f"cannot write the trace file {path}: it is a folder (name a file in it, "
                         f"e.g. {os.path.join(path, 'trace.json')})")
    if blocker is not None:  # makedirs said only "File exists"
        raise UsageError(f"cannot write the trace file {path}: {blocker} is a file, not a folder")
    folder = str(target.parent)
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise UsageError(f"cannot write the trace file {path}: {e.strerror or e}") from None


def check_environment() -> None:
    """A bad ACLSERVE_DEVICE or ACLSERVE_CPU_* setting is one line now, not a traceback from
    inside acl.init later (`aclserve profile` builds its runtime as serve does: it checks too).
    Not ACLSERVE_CPU_THREADS: the runtime they build sets the threads from cpu_threads (never
    None: app.build_runtime), so the variable is never read; _note_threads_variable_ignored says so."""
    import os
    from ..acl import DEVICE_CHOICES
    from ..acl.cpu import settings
    device = os.environ.get("ACLSERVE_DEVICE", "").strip().lower()
    if device and device not in DEVICE_CHOICES:
        raise UsageError(f"ACLSERVE_DEVICE must be one of {', '.join(DEVICE_CHOICES)}, not {device!r}")
    try:
        settings.check_environment(threads_too=False)
    except ValueError as e:
        raise UsageError(str(e)) from None


def end_if_work_abandoned(status: int) -> None:
    """The server has stopped with `status`. When its shutdown abandoned work that still runs (a
    load or warm-up past the deadline, an instance the device has not let go of: app.work_left_running),
    the process ends here, its output written, without the interpreter's teardown: that freed
    the memory such a daemon thread still copied into (SIGSEGV at exit) and destroyed ONNX
    Runtime's threads under it (SIGABRT, "terminate called without an active exception"). So
    does a server whose stderr reader stalled (logs.writer_stalled). A clean shutdown exits as usual."""
    import os
    import sys
    from ..app import work_left_running
    from .. import logs
    if logs.writer_stalled():  # stderr's reader stalled: flushing stderr at exit would wait for it for good
        os._exit(status)
    if not work_left_running():
        return
    logs.stop_queue()
    logging.shutdown()  # (flushes the handlers)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader gone, a stream closed: nothing more to write there
            pass
    os._exit(status)


def _exiting() -> None:
    """Shut down already (the loop closed, which put the signals' default actions back): a
    signal more is ignored, not a kill that turns a clean exit into -15 while the interpreter ends."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


def _run(coro):
    """Run on uvloop where it is installed (about 10 % more requests/s), else asyncio's loop;
    what `coro` returns."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
