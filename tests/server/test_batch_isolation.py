"""One request whose data the model cannot run (a token id past its embedding's rows) failed
every request batched with it, 500 for all (found by an independent check): a failed batch of
several requests is re-run one request per run, so only that request fails."""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from aclserve.acl.cpu import faults

from tests.serving import ServerThread
from tests.tiny_models import compile_cpu_om, save_graph

from .hostile import metric, wait_for

VOCAB = 10
TABLE = np.arange(VOCAB * 3, dtype=np.float32).reshape(VOCAB, 3)


@pytest.fixture
def embedding_dir(tmp_path):
    """ids INT64 [N, 4] -> the rows of a [10, 3] table, [N, 4, 3] (Gather: an id of 10 or more fails)."""
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["emb"])], "embed",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 4])],
                              [helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["N", 4, 3])],
                              [numpy_helper.from_array(TABLE, "table")])
    models = tmp_path / "models"
    models.mkdir()
    compile_cpu_om(save_graph(graph, tmp_path / "embed.onnx"), models / "embed.om")
    (models / "embed.yaml").write_text("slots: 1\n")  # the held batch keeps the only slot: the rest queue
    return models


def queued(url: str) -> float:
    text = urllib.request.urlopen(f"http://{url}/metrics", timeout=30).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith('aclserve_queue_depth{model="embed"'))


def infer(url: str, ids: list[int]):
    body = json.dumps({"inputs": [{"name": "ids", "datatype": "INT64", "shape": [1, 4], "data": ids}]}).encode()
    req = urllib.request.Request(f"http://{url}/v2/models/embed/infer", data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_request_the_model_cannot_run_fails_alone(embedding_dir, make_config, clean_faults):
    srv = ServerThread(make_config(embedding_dir)).start()
    gate = threading.Event()
    try:
        held = faults.inject("execute", nth=1, hold=gate, code=0)  # the first run waits: the others queue
        requests = [[0, 1, 2, 3]] + [[i, i, 9 - i, 1] for i in range(6)]
        requests.insert(4, [0, 1, VOCAB + 5, 2])  # the bad one, batched with good ones
        with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
            first = pool.submit(infer, srv.url, requests[0])
            assert held.entered.wait(30)
            rest = [pool.submit(infer, srv.url, ids) for ids in requests[1:]]
            asyncio.run(wait_for(lambda: queued(srv.url) == len(rest), limit_s=30))
            gate.set()
            answers = [first.result()] + [f.result() for f in rest]
        for ids, (status, body) in zip(requests, answers):
            if VOCAB + 5 in ids:
                assert status == 500 and "failed" in body["error"], body
                continue
            assert status == 200, (ids, body)
            np.testing.assert_array_equal(np.array(body["outputs"][0]["data"]).reshape(1, 4, 3), TABLE[[ids]])
        failed = metric(srv.url, "aclserve_batch_faults_total", 'model="embed",outcome="failed",version="1"')
        retried = metric(srv.url, "aclserve_batch_faults_total", 'model="embed",outcome="retried",version="1"')
        assert failed == 2 and retried == len(requests) - 1  # the batch, then the bad request's own run
        assert infer(srv.url, [3, 3, 3, 3])[0] == 200
    finally:
        gate.set()
        srv.close()
