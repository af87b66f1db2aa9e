#!/usr/bin/env python3
"""How long one hostile request can hold the server's event loop: the worst `GET /v2/health/live`
latency while it runs, against a request of the same size that costs only its reading.

Starts `aclserve serve` on the repository's models/ (the digits and digits_image models; with an
answer case, a copy of them and `tiled`, made here) on free loopback ports, then for each case
sends the hostile request, and then the baseline (the same number of bytes to a model that does
not exist: read, then refused), while a prober thread asks /v2/health/live every 5 ms on a
connection of its own. The event loop answers the probe, so a loop held by Python work
proportional to what a client sent shows as a large worst latency. Prints one Markdown row per
case: the hostile request's answer, its worst probe latency and the baseline's, each with the
most CPU time the server's event loop took while a probe waited (what a latency is on an idle
machine: other processes' load lengthens latencies, not that). README "Limits" quotes runs.
A server that dies during a case ends the run in one error line, exit status 1; Ctrl-C or
SIGTERM stop it and remove the run's folders, exit 130 (tools/bench_run.py).

    python tools/loop_stalls.py [--cases jpeg-segments,...] [--mb 15]

Cases (each about --mb MB, gRPC ones 3.5-6 MB): jpeg-segments (2-byte COM segments before the
frame), jpeg-exif (64 KB EXIF segments without an Orientation), png-chunks (empty text chunks
before IDAT), json-spaces (a `"data"` key followed by whitespace), json-data-keys (`"data"`
repeated), long-name (an input named "/ " repeated: its error message quotes it), many-dims (a
shape of a million dimensions), json-keys (a valid request whose `parameters` hold 800,000
distinct keys), grpc-inputs (a ModelInfer of empty inputs), grpc-params (a valid ModelInfer
whose `parameters` hold as many distinct entries as the memory budget let through before they
were bounded), grpc-params-bound (one of 16,384 entries, the most now served), grpc-params-inputs
(those, then inputs each with an empty `contents` to the memory budget), grpc-trace (a
TraceSetting of many settings), json-answer (a request of 98 bytes whose answer is 8,388,608
FP32 values as JSON, 92 MB, sent as http.client sends it, with `Accept-Encoding: identity`, so
that aiohttp answers it; its baseline: the same answer's values binary, 32 MB), grpc-answer (the
same request over gRPC, whose answer is binary; baseline as json-answer's).
"""
from __future__ import annotations

import argparse
import functools
import http.client
import json
import math
import os
import struct
import sys
import time
import zlib

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_args import names_of, positive_int  # noqa: E402
from bench_common import ManagedProcess, free_port, keep_if_failed, wait_ready  # noqa: E402
from bench_run import ensure_running, run_folder, run_tool  # noqa: E402
from peak_sampler import PeakSampler  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGES = "/v2/models/digits_image/infer"
# the longest message of more fields than grpc_wire walks that max_request_bytes took while such a message was
# charged 65 bytes a byte and parsed (it is refused now, after the walk)
WALKED_PAST = (256 << 20) // 65
NUMBERS = "/v2/models/digits/infer"
TILED = "/v2/models/tiled/infer"
TILED_VALUES = 1 << 22  # values of a row of tiled's output (16 MiB of FP32)
TILED_X = [0.12345678, -1.2345678]  # written in 10-11 characters each, as random FP32 values are
ANSWER_CASES = ("json-answer", "grpc-answer")
CASES = ("jpeg-segments", "jpeg-exif", "png-chunks", "json-spaces", "json-data-keys", "long-name", "many-dims",
         "json-keys", "grpc-inputs", "grpc-params", "grpc-params-bound", "grpc-params-inputs", "grpc-trace",
         *ANSWER_CASES)
INFER = "/inference.GRPCInferenceService/ModelInfer"


class HealthProbe:
    """One GET /v2/health/live on a keep-alive connection of its own: its latency in ms, infinite
    when no answer came (called by a PeakSampler's thread only; close() once that thread has
    stopped). `loop_cpu_peak`: the most CPU time the server's event loop thread (`loop_pid`, its
    main thread) took while a probe waited, in ms since it was last set to 0: unlike a latency,
    not lengthened by other processes' load (from /proc's schedstat, where Linux has one; else 0)."""

    def __init__(self, port: int, loop_pid: int):
        self._port, self._conn = port, None
        self._schedstat = f"/proc/{loop_pid}/task/{loop_pid}/schedstat"
        self.loop_cpu_peak = 0.0

    def __call__(self) -> float:
        if self._conn is None:
            self._conn = http.client.HTTPConnection("127.0.0.1", self._port, timeout=60)
        cpu = self._loop_cpu_ns()
        start = time.perf_counter()
        try:
            self._conn.request("GET", "/v2/health/live")
            self._conn.getresponse().read()
        except (OSError, http.client.HTTPException):  # (a server gone: the run names it; the sampler's
            self.close()                              # thread printed a traceback and stopped sampling)
            return math.inf
        latency = (time.perf_counter() - start) * 1000
        self.loop_cpu_peak = max(self.loop_cpu_peak, (self._loop_cpu_ns() - cpu) / 1e6)
        return latency

    def _loop_cpu_ns(self) -> int:
        try:
            with open(self._schedstat) as f:
                return int(f.read().split()[0])  # time on a CPU, ns
        except OSError:
            return 0

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _jpeg(segments: bytes) -> bytes:
    """A small real JPEG with `segments` (whole marker segments) right after its SOI."""
    import io
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(buf, "JPEG")
    return buf.getvalue()[:2] + segments + buf.getvalue()[2:]


def _exif_without_orientation() -> bytes:
    entries = (0xFFFF - 2 - 6 - 8 - 2) // 12
    tiff = b"II" + struct.pack("<HI", 42, 8) + struct.pack("<H", entries) + struct.pack("<HHII", 0x010F, 2, 1, 0) * entries
    payload = b"Exif\0\0" + tiff
    return b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload


def _png_of_chunks(count: int) -> bytes:
    import io
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(buf, "PNG")
    png, ihdr_end = buf.getvalue(), 8 + 25
    text = struct.pack(">I", 0) + b"tEXt" + struct.pack(">I", zlib.crc32(b"tEXt"))
    return png[:ihdr_end] + text * count + png[ihdr_end:]


def http_cases(mb: int) -> dict:
    """name -> (path, body, headers) of the HTTP cases."""
    size = mb << 20
    raw_image = {"Inference-Header-Content-Length": "0", "Content-Type": "application/octet-stream"}
    as_json = {"Content-Type": "application/json"}
    return {
        "jpeg-segments": (IMAGES, _jpeg(b"\xff\xfe\x00\x02" * (size // 4)), raw_image),
        "jpeg-exif": (IMAGES, _jpeg(_exif_without_orientation() * (size // 0x10001)), raw_image),
        "png-chunks": (IMAGES, _png_of_chunks(size // 12), raw_image),
        "json-spaces": (NUMBERS, b'{"data"' + b" " * size + b":1}", as_json),
        "json-data-keys": (NUMBERS, b'{"x":' + b'"data"' * (size // 6) + b"}", as_json),
        "long-name": (NUMBERS, json.dumps({"inputs": [{"name": "/ " * (size // 2), "datatype": "FP32",
                                                       "shape": [1, 64], "data": [0.0] * 64}]}).encode(), as_json),
        "many-dims": (NUMBERS, json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1] * 1_000_000,
                                                       "data": [0.0] * 64}]}).encode(), as_json),
        "json-keys": (NUMBERS, _many_keys(size), as_json),
        "json-answer": (TILED, _tiled_request(binary=False), as_json),
    }


def _tiled_request(binary: bool) -> bytes:
    """tiled's request of two rows, its answer's values JSON or binary."""
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 1], "data": TILED_X}]}
    if binary:
        doc["parameters"] = {"binary_data_output": True}
    return json.dumps(doc).encode()


def _tiled_models(folder: str) -> str:
    """A models folder: the repository's models/ and tiled.onnx, y = Tile(x [N,1], [1, TILED_VALUES])
    (FP32), compiled when the server loads it."""
    import shutil
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    models = os.path.join(folder, "models")
    shutil.copytree(os.path.join(ROOT, "models"), models)
    reps = numpy_helper.from_array(np.array([1, TILED_VALUES], np.int64), "reps")
    graph = helper.make_graph([helper.make_node("Tile", ["x", "reps"], ["y"])], "tiled",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", TILED_VALUES])],
                              [reps])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, os.path.join(models, "tiled.onnx"))
    return models


def _many_keys(size: int) -> bytes:
    """A valid request to digits whose `parameters` hold as many distinct keys as `size` bytes
    take (800,000 at 15 MB: within max_json_bytes and max_json_elements)."""
    count = size // 20
    keys = b",".join(b'"p%014d":0' % i for i in range(count))
    return (b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,64],"data":[' + b",".join([b"0.0"] * 64)
            + b']}],"parameters":{' + keys + b"}}")


def grpc_cases(wanted: list[str]) -> dict:
    """name -> (method, serialized request) of the gRPC cases among `wanted` (some take seconds to make)."""
    from tritonclient.grpc import service_pb2 as pb
    makers = {"grpc-inputs": (INFER, lambda: (
                  # 3.5 MB: a message past grpc_wire's walk was charged 64 bytes a byte,
                  # and 7 MB would have been over max_request_bytes
                  pb.ModelInferRequest(model_name="digits").SerializeToString() + b"\x2a\x00" * (7 << 18))),
              # as many entries as a message charged 64 bytes a byte could hold within max_request_bytes
              "grpc-params": (INFER, lambda: _many_parameters(pb)),
              "grpc-params-bound": (INFER, lambda: _many_parameters(pb, 16_384)),
              "grpc-params-inputs": (INFER, lambda: _bound_then_inputs(pb)),
              "grpc-trace": ("/inference.GRPCInferenceService/TraceSetting", lambda: _many_settings(pb)),
              "grpc-answer": (INFER, lambda: _tiled_message(pb))}
    return {name: (method, make()) for name, (method, make) in makers.items() if name in wanted}


def _bound_then_inputs(pb) -> bytes:
    """The bound's walk, then what parses slowest for its bytes besides parameters (two objects in 4 bytes)."""
    bound = _many_parameters(pb, 16_384)
    return bound + b"\x2a\x02\x2a\x00" * ((WALKED_PAST - len(bound)) // 4)


def _many_settings(pb) -> bytes:
    trace = pb.TraceSettingRequest()
    for k in range(400_000):
        trace.settings[f"k{k}"].value.append("1")
    return trace.SerializeToString()


def _tiled_message(pb) -> bytes:
    request = pb.ModelInferRequest(model_name="tiled")
    request.inputs.add(name="x", datatype="FP32", shape=[2, 1])
    request.raw_input_contents.append(np.array(TILED_X, np.float32).reshape(2, 1).tobytes())
    return request.SerializeToString()


def _many_parameters(pb, entries: int | None = None) -> bytes:
    """A valid ModelInfer to digits whose `parameters` hold `entries` distinct entries (keys of 1-4
    characters, each a bool), or as many as WALKED_PAST bytes hold (344,124)."""
    request = pb.ModelInferRequest(model_name="digits")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 64])
    request.raw_input_contents.append(np.zeros((1, 64), np.float32).tobytes())
    count = entries if entries is not None else (WALKED_PAST - request.ByteSize()) // 12  # 12 bytes an entry
    for k in range(count):
        request.parameters[np.base_repr(k, 36)].bool_param = True
    return request.SerializeToString()


def post(port: int, path: str, body: bytes, headers: dict) -> str:
    """The answer's status (and size, when it is an answer case's)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        size = len(response.read())
        return f"{response.status} ({size:,} bytes)" if path == TILED else str(response.status)
    finally:
        conn.close()


def call(channel, method: str, message: bytes) -> str:
    try:
        answer = channel.unary_unary(method)(message, timeout=120)
        return f"OK ({len(answer):,} bytes)" if b"tiled" in message[:16] else "OK"
    except grpc.RpcError as e:
        return e.code().name


def measured(prober: PeakSampler, probe: HealthProbe, send) -> tuple[str, float, float]:
    """`send()`'s outcome, the worst probe latency while it ran (and just after: a probe sent
    just before it ended) and the most loop CPU a probe waited for."""
    time.sleep(0.1)
    prober.reset()
    probe.loop_cpu_peak = 0.0
    outcome = send()
    time.sleep(0.05)
    return outcome, prober.peak(), probe.loop_cpu_peak


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=names_of(CASES), default=",".join(CASES),
                    help=f"comma-separated, of {', '.join(CASES)} (default all)")
    ap.add_argument("--mb", type=positive_int, default=15,
                    help="size of the HTTP cases' bodies (max_json_bytes: 16 MiB; default %(default)s)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    return run_tool("loop_stalls", lambda: run(args))


def run(args) -> int:
    port, grpc_port = free_port(), free_port()
    with run_folder("aclserve-stalls-") as folder:
        models = _tiled_models(folder) if set(args.cases) & set(ANSWER_CASES) else os.path.join(ROOT, "models")
        server = ManagedProcess([sys.executable, "-m", "aclserve", "serve", "--models", models,
                                 "--port", str(port), "--grpc-port", str(grpc_port), "--device", "cpu",
                                 "--model-control-mode", "none", "--log-level", "warning"],
                                os.path.join(folder, "server.log"), cwd=ROOT)
        try:
            wait_ready(server, f"http://127.0.0.1:{port}", 120)
            probe = HealthProbe(port, server.proc.pid)
            prober = PeakSampler(probe, 0.005)
            try:
                rows = measure_cases(args, server, port, grpc_port, prober, probe)
            finally:
                prober.close()
                probe.close()
        finally:
            code = server.close()
        print(f"server exit status {code}; {keep_if_failed(folder, code != 0)}\n")
    print("| case | bytes | answer | worst /v2/health/live ms (loop CPU ms) "
          "| same size, only read (answers: binary): ms (loop CPU ms) |")
    print("|---|---:|---|---:|---:|")
    for name, size, outcome, worst, cpu, baseline, baseline_cpu in rows:
        print(f"| {name} | {size:,} | {outcome} | {worst:.0f} ({cpu:.0f}) | {baseline:.0f} ({baseline_cpu:.0f}) |")
    return 0


def measure_cases(args, server: ManagedProcess, port: int, grpc_port: int, prober: PeakSampler,
                  probe: HealthProbe) -> list[tuple]:
    """A row per case of --cases: its hostile request and its baseline, each measured."""
    # an answer's baseline: the same answer's values binary (no JSON to write)
    binary_answer = functools.partial(post, port, TILED, _tiled_request(binary=True), {})
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}",
                               options=[("grpc.max_send_message_length", 64 << 20),
                                        ("grpc.max_receive_message_length", 64 << 20)]) as channel:
        sends = [(name, len(message), functools.partial(call, channel, method, message),
                  binary_answer if name in ANSWER_CASES else functools.partial(
                      call, channel, INFER, b"\x0a\x07missing" + b"\x1a\x00" * ((len(message) - 9) // 2)))
                 for name, (method, message) in grpc_cases(args.cases).items()]
        sends += [(name, len(body), functools.partial(post, port, path, body, headers),
                   binary_answer if name in ANSWER_CASES else functools.partial(
                       post, port, "/v2/models/missing/infer", body, headers))
                  for name, (path, body, headers) in http_cases(args.mb).items() if name in args.cases]
        rows = []
        for name, size, hostile_send, baseline_send in sends:
            try:
                hostile = measured(prober, probe, hostile_send)
                baseline = measured(prober, probe, baseline_send)
            finally:  # a dead server is the failure to name, not the refused connections it left
                ensure_running(server, f"the {name} case")
            rows.append((name, size, *hostile, baseline[1], baseline[2]))
    return rows


if __name__ == "__main__":
    sys.exit(main())
