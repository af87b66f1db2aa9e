"""The serving path keeps off the host buffers its async copies own: a slot's staging buffer is
packed only once its batch's input copies completed, its outputs unpacked only once its output
copies did. On a device either mistake gives wrong answers silently; with ACLSERVE_CPU_CHECK_HOST
the CPU runtime poisons a D2H copy's destination until the copy ran and fails a copy whose host
side was written before it ran (aclserve/acl/cpu/_async_host.py). Here the real server runs
mixed batches on three slots under delays of its copies, executions and every stream task, which
widen the windows: every answer must be ONNX Runtime's on the request's own rows (a tester's
completer that skipped its event waits gave 1,224 wrong answers of such a run)."""
from __future__ import annotations

import concurrent.futures
import json
import urllib.error
import urllib.request

import numpy as np
import onnxruntime as ort
import pytest

from aclserve.acl.cpu import faults

from tests.serving import ServerThread
from tests.tiny_models import affine_onnx, affine_request, compile_cpu_om

CLIENTS, REQUESTS_EACH = 6, 12


@pytest.fixture
def affine_dir(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    source = affine_onnx(tmp_path / "affine.onnx")
    compile_cpu_om(source, models / "affine.om")
    (models / "affine.yaml").write_text("slots: 3\nbatching: {max_queue_delay_ms: 2}\n")
    return models, source


def infer(url: str, inputs: dict[str, np.ndarray]) -> tuple[int, dict]:
    tensors = [{"name": name, "datatype": datatype, "shape": list(inputs[name].shape),
                "data": inputs[name].ravel().tolist()} for name, datatype in (("x", "FP32"), ("idx", "INT64"))]
    req = urllib.request.Request(f"http://{url}/v2/models/affine/infer", data=json.dumps({"inputs": tensors}).encode(),
                                 method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def client(url: str, first: int, rows_of: list[int]) -> list[tuple[dict, int, dict]]:
    """Its requests one after another, each of distinct rows: (inputs, status, answer)."""
    out = []
    for rows in rows_of:
        inputs = affine_request(rows, first_id=first)
        first += rows
        out.append((inputs, *infer(url, inputs)))
    return out


def test_every_answer_is_its_own_rows_under_delayed_copies_and_streams(affine_dir, make_config, clean_faults,
                                                                      host_checks):
    models, source = affine_dir
    for spec in ("memcpy:delay_ms=1,probability=0.3", "execute:delay_ms=2,probability=0.5",
                 "stream:delay_ms=1,probability=0.2"):
        faults.inject(**faults.parse(spec)[0])
    rng = np.random.default_rng(11)
    plans = [rng.integers(1, 9, REQUESTS_EACH).tolist() for _ in range(CLIENTS)]
    with ServerThread(make_config(models)) as srv, concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        runs = [pool.submit(client, srv.url, 1000 * c, plan) for c, plan in enumerate(plans)]
        answers = [answer for run in runs for answer in run.result()]
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    assert len(answers) == CLIENTS * REQUESTS_EACH
    wrong = [(int(inputs["idx"][0, 0]), status, body) for inputs, status, body in answers
             if not _is_own_answer(session, inputs, status, body)]
    assert not wrong, f"{len(wrong)} of {len(answers)} answers wrong, the first: {wrong[0]}"


def _is_own_answer(session, inputs: dict[str, np.ndarray], status: int, body: dict) -> bool:
    """Whether `body` is ONNX Runtime's answer to `inputs` (a NaN of the poison comes as null)."""
    if status != 200:
        return False
    expected = dict(zip(("y", "s"), session.run(["y", "s"], inputs)))
    got = {out["name"]: np.array(out["data"], dtype=np.float64).reshape(out["shape"]) for out in body["outputs"]}
    return got.keys() == expected.keys() and all(
        np.allclose(got[name], expected[name], rtol=1e-5, atol=1e-6) for name in expected)
