"""`aclserve serve` (run the server) and `aclserve infer` (a small KServe v2 client)."""
from __future__ import annotations

import asyncio
import json
import logging
import sys
import urllib.error
import urllib.parse
import urllib.request

import numpy as np

from ..cli import UsageError
from .codec import HEADER_LENGTH


def add_commands(sub) -> None:
    p = sub.add_parser("serve", help="run the KServe v2 HTTP and gRPC server",
                       description="Serve the models of a repository folder over the KServe v2 protocol. "
                                   "Options given here override the config file, which overrides the "
                                   "embedded default (aclserve/configs/default.yaml).")
    p.add_argument("--config", metavar="FILE", help="YAML config merged over the embedded default")
    p.add_argument("--models", metavar="DIR", help="model repository folder (models_dir)")
    p.add_argument("--host", help="address to listen on (default 127.0.0.1; 0.0.0.0 to expose)")
    p.add_argument("--port", type=int, help="TCP port (default 8000; 0 = any free port)")
    p.add_argument("--grpc-port", type=int, metavar="PORT",
                   help="TCP port of the KServe v2 gRPC endpoint (default 8001; 0 = no gRPC)")
    p.add_argument("--compile-cache-dir", metavar="DIR",
                   help="where dropped .onnx files are compiled to (default <models>/.cache)")
    p.add_argument("--device", choices=("auto", "cpu", "npu"), help="ACL to use (default auto)")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error", "critical"),
                   help="logging level (default info; debug also logs every request)")
    p.add_argument("--cpu-threads", type=int, metavar="N", help="ONNX Runtime threads per instance (CPU runtime)")
    p.add_argument("--model-control-mode", choices=("poll", "explicit", "none"),
                   help="how the repository follows the models folder (default poll)")
    p.add_argument("--max-batch", type=int, metavar="N",
                   help="largest batch formed for every model (model_defaults.batching.max_batch_size)")
    p.add_argument("--max-delay-ms", type=float, metavar="MS",
                   help="queue delay for partial batches (model_defaults.batching.max_queue_delay_ms)")
    p.add_argument("--log-format", choices=("text", "json"), help="log lines as text or one JSON object per line")
    p.add_argument("--request-log", action="store_true", default=None,
                   help="log one line per infer request (request id, model, version, status, durations)")
    p.add_argument("--trace", metavar="FILE",
                   help="trace requests to FILE (Chrome trace / Perfetto JSON; written at shutdown, "
                        "or every --trace-log-frequency traces)")
    p.add_argument("--trace-rate", type=int, metavar="N", help="trace one request in N (default 1000)")
    p.add_argument("--trace-count", type=int, metavar="N", help="stop after N traces (default -1: never)")
    p.add_argument("--trace-log-frequency", type=int, metavar="N",
                   help="write the trace file every N traces, to FILE.0, FILE.1, ... (default 0: at shutdown)")
    p.add_argument("--trace-format", choices=("chrome", "triton"), help="trace file format (default chrome)")
    p.set_defaults(func=run_serve)

    q = sub.add_parser("infer", help="send one inference request to a running server",
                       description="Send .npy inputs to a KServe v2 server (binary tensor extension) "
                                   "and print the outputs.")
    q.add_argument("model")
    q.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy", required=True,
                   help="an input tensor (repeat for several inputs)")
    q.add_argument("--url", default="http://127.0.0.1:8000", help="server URL (default %(default)s)")
    q.add_argument("--version", help="model version (default: the server's choice)")
    q.add_argument("--output", "-o", action="append", default=[], metavar="NAME",
                   help="an output to return (repeat; default all)")
    q.add_argument("--priority", type=int, help="request priority level (1 = highest)")
    q.add_argument("--json", action="store_true", help="print the outputs as one JSON object")
    q.set_defaults(func=run_infer)

    from .profile_cli import add_command as add_profile
    add_profile(sub)


QUIET_LOGGERS = ("watchdog", "asyncio", "grpc", "PIL", "urllib3")


def serve_overrides(args) -> dict:
    return {"host": args.host, "port": args.port, "grpc_port": args.grpc_port, "models_dir": args.models,
            "compile_cache_dir": args.compile_cache_dir, "device": args.device,
            "log_level": args.log_level, "cpu_threads": args.cpu_threads,
            "model_control_mode": args.model_control_mode,
            "model_defaults.batching.max_batch_size": args.max_batch,
            "model_defaults.batching.max_queue_delay_ms": args.max_delay_ms,
            "log_format": args.log_format, "request_log": args.request_log,
            "trace.file": args.trace, "trace.level": "TIMESTAMPS" if args.trace else None,
            "trace.rate": args.trace_rate, "trace.count": args.trace_count,
            "trace.log_frequency": args.trace_log_frequency, "trace.format": args.trace_format}


def run_serve(args) -> int:
    from ..app import serve  # the composition root: builds the runtime, repository and servers
    from ..config import ConfigError, load_server_config

    try:
        config = load_server_config(args.config, serve_overrides(args))
    except (ConfigError, OSError) as e:
        raise UsageError(f"bad configuration: {e}") from None
    _check_fault_spec()
    from .. import logs
    logs.configure(config.log_level, config.log_format)
    if config.request_log:  # the request log speaks at info whatever the level of the rest
        logging.getLogger("aclserve.requests").setLevel(logging.INFO)
    for noisy in QUIET_LOGGERS:  # --log-level debug is about aclserve, not every inotify event
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    from .. import heap
    heap.limit_arenas()  # before any worker thread: reloads then give their memory back
    from ..repository import RepositoryError
    try:
        _run(serve(config))
    except (RepositoryError, ConfigError) as e:
        raise UsageError(str(e)) from None
    except OSError as e:  # e.g. the port is taken
        if e.strerror is None:  # our own message (the gRPC port names itself)
            raise UsageError(str(e)) from None
        raise UsageError(f"cannot listen on {config.host}:{config.port}: {e.strerror or e}") from None
    return 0


def _check_fault_spec() -> None:
    """A bad ACLSERVE_CPU_FAULTS is one line now, not a traceback from inside acl.init later."""
    import os
    spec = os.environ.get("ACLSERVE_CPU_FAULTS", "")
    if spec.strip():
        from ..acl.cpu import faults
        try:
            faults.parse(spec)
        except ValueError as e:
            raise UsageError(str(e)) from None


def _run(coro) -> None:
    """Run on uvloop where it is installed (about 10 % more requests/s), else asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)


# -- infer client ---------------------------------------------------------------------------------

def _load_inputs(pairs: list[str]) -> dict[str, np.ndarray]:
    inputs = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--input expects NAME=FILE.npy, got {pair!r}")
        try:
            arr = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise UsageError(f"cannot read {path}: {e}") from None
        inputs[name] = np.ascontiguousarray(arr)
    return inputs


def build_request(inputs: dict[str, np.ndarray], outputs: list[str], priority: int | None = None
                  ) -> tuple[bytes, int]:
    """A binary-extension request body and its JSON header length."""
    from ..acl.constants import numpy_to_kserve

    items = []
    for name, arr in inputs.items():
        try:
            datatype = numpy_to_kserve(arr.dtype)
        except ValueError:
            raise UsageError(f"input {name}: dtype {arr.dtype} is not supported") from None
        items.append({"name": name, "datatype": datatype, "shape": list(arr.shape),
                      "parameters": {"binary_data_size": arr.nbytes}})
    doc: dict = {"inputs": items}
    if outputs:
        doc["outputs"] = [{"name": n, "parameters": {"binary_data": True}} for n in outputs]
    else:
        doc["parameters"] = {"binary_data_output": True}
    if priority:
        doc.setdefault("parameters", {})["priority"] = priority
    head = json.dumps(doc).encode()
    return b"".join([head, *(a.tobytes() for a in inputs.values())]), len(head)


def parse_response(body: bytes, header_length: int | None) -> dict[str, np.ndarray]:
    from ..acl.constants import kserve_to_numpy

    head = json.loads(body if header_length is None else body[:header_length])
    offset = header_length or 0
    result = {}
    for out in head.get("outputs", []):
        size = (out.get("parameters") or {}).get("binary_data_size")
        if out["datatype"] == "BYTES":
            raise UsageError(f"output {out['name']}: BYTES outputs are not supported by this client")
        dtype = kserve_to_numpy(out["datatype"])
        if size is not None:
            arr = np.frombuffer(body, dtype, size // dtype.itemsize, offset)
            offset += size
        else:
            arr = np.asarray(out["data"], dtype=dtype)
        result[out["name"]] = arr.reshape(out["shape"])
    return result


def cast_to_model(inputs: dict[str, np.ndarray], metadata: dict) -> list[str]:
    """Cast each input to the dtype the model declares where numpy calls it safe within the kind
    (float64 -> FP32, int64 -> INT32); returns one note per cast. A cast across kinds (float data
    for an INT64 input) is left for the server to refuse."""
    from ..acl.constants import kserve_to_numpy

    notes = []
    declared = {t.get("name"): t.get("datatype") for t in metadata.get("inputs", [])}
    for name, arr in inputs.items():
        try:
            target = kserve_to_numpy(declared[name])
        except (KeyError, ValueError):
            continue
        if arr.dtype != target and np.can_cast(arr.dtype, target, casting="same_kind"):
            inputs[name] = arr.astype(target)
            notes.append(f"input {name}: {arr.dtype} cast to {declared[name]} as the model declares")
    return notes


def _metadata(url: str) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return {}  # the infer request itself reports what is wrong


def run_infer(args) -> int:
    inputs = _load_inputs(args.input)
    path = f"/v2/models/{urllib.parse.quote(args.model, safe='')}"
    if args.version:
        path += f"/versions/{urllib.parse.quote(args.version, safe='')}"
    for note in cast_to_model(inputs, _metadata(args.url.rstrip("/") + path)):
        print(f"aclserve infer: {note}", file=sys.stderr)
    body, header_length = build_request(inputs, args.output, args.priority)
    req = urllib.request.Request(args.url.rstrip("/") + path + "/infer", data=body, method="POST",
                                 headers={HEADER_LENGTH: str(header_length),
                                          "Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            data = resp.read()
            length = resp.headers.get(HEADER_LENGTH)
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            message = json.loads(raw)["error"]
        except (ValueError, KeyError, TypeError):
            message = raw.decode(errors="replace") or e.reason
        print(f"aclserve infer: error: HTTP {e.code}: {message}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as e:
        print(f"aclserve infer: error: cannot reach {args.url}: {getattr(e, 'reason', e)}", file=sys.stderr)
        return 1
    outputs = parse_response(data, int(length) if length is not None else None)
    if args.json:
        print(json.dumps({n: {"shape": list(a.shape), "dtype": str(a.dtype), "data": a.tolist()}
                          for n, a in outputs.items()}))
    else:
        with np.printoptions(threshold=200, edgeitems=4):
            for name, arr in outputs.items():
                print(f"{name} {arr.dtype} {list(arr.shape)}")
                print(arr)
    return 0
