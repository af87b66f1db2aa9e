"""Pictures decoded in the images' decode pool were drawn on the event loop's track in Chrome
traces: a request's decode span there ran from its body's receipt to its pictures decoded, the
pool's threads' work included (found by an independent tester; only gRPC's large contents,
decoded in a worker thread, were kept off the loop). Now the loop's span ends where the pictures
are handed to the pool, and their decode is drawn on the request's lane, `decode pictures`
inside its `decode`, over HTTP and gRPC. Real server, the shipped digits_image model, tritonclient."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import tritonclient.grpc as grpc_client
import tritonclient.http as http_client

from aclserve.trace import chrome
from tests import REPO
from tests.images.images_data import encode, gradient
from tests.serving import ServerThread, free_port, server_config

EPS_US = 0.01  # float microseconds of integer nanoseconds


def _pictures(client_module):
    blobs = [encode(gradient(32, 32, channels=1, seed=seed)) for seed in range(2)]
    x = client_module.InferInput("x", [len(blobs), 1], "BYTES")
    x.set_data_from_numpy(np.array(blobs, dtype=object).reshape(-1, 1))
    return [x]


def test_pictures_decoded_in_the_pool_are_drawn_on_the_request_s_lane_not_on_the_event_loop(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    for name in ("digits_image.om", "digits_image.yaml", "digits_labels.txt"):
        shutil.copy(os.path.join(REPO, "models", name), models / name)
    trace = {"level": "TIMESTAMPS", "rate": 1, "file": str(tmp_path / "trace.json"), "format": "chrome"}
    config = server_config(models, images={"workers": 2}, trace=trace, trace_dir=str(tmp_path / "traces"),
                           grpc_port=free_port())
    with ServerThread(config) as srv:
        with http_client.InferenceServerClient(srv.url) as client:
            client.infer("digits_image", _pictures(http_client), request_id="pictures-http")
        with grpc_client.InferenceServerClient(f"127.0.0.1:{config.grpc_port}") as client:
            client.infer("digits_image", _pictures(grpc_client), request_id="pictures-grpc")
    events = json.loads((tmp_path / "trace.json").read_bytes())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    loop_tid = chrome.global_tid(chrome.PID_HOST, chrome.TID_LOOP)
    for rid in ("pictures-http", "pictures-grpc"):
        (request,) = [e for e in spans if e["name"] == f"request {rid}"]
        lane = [e for e in spans if e["tid"] == request["tid"] and e["pid"] == request["pid"]
                and request["ts"] <= e["ts"] <= request["ts"] + request["dur"]]
        (decode,) = [e for e in lane if e["name"] == "decode"]
        (pictures,) = [e for e in lane if e["name"] == "decode pictures"]
        assert decode["ts"] <= pictures["ts"] and pictures["ts"] + pictures["dur"] <= decode["ts"] + decode[
            "dur"] + EPS_US, (decode, pictures)
        (on_loop,) = [e for e in spans if e["tid"] == loop_tid and e["name"].startswith("decode")
                      and e["args"]["trace_id"] == request["args"]["trace_id"]]
        assert on_loop["ts"] == decode["ts"]  # its JSON or message, decoded on the loop, up to the hand-over
        assert on_loop["ts"] + on_loop["dur"] <= pictures["ts"] + EPS_US, (rid, on_loop, pictures)
