"""A fault of ACLSERVE_CPU_FAULTS scoped to one model keeps to it across rebuilds.

`model_id=` was the only scope: each failed batch rebuilds its instance, whose new load gets a new
model id, so "execute:model_id=5,nth=60,count=30" failed one batch, not 30 (a tester). `model=`
names the model as its OM's header does (the server's compile of model M: M-<key>), which every
load of it carries: a count=N fault fails N batches of that model, one rebuild each, and none of
another model's."""
from __future__ import annotations

import json

from aclserve.acl.cpu import faults

from tests.serving import ServerThread, post_status
from tests.tiny_models import affine_onnx, compile_cpu_om, double_onnx

from .hostile import metric

BODIES = {
    "double": {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]},
    "affine": {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [1.0] * 8},
                          {"name": "idx", "datatype": "INT64", "shape": [1, 3], "data": [1, 2, 3]}]},
}


def infer(url: str, model: str) -> int:
    return post_status(url, f"/v2/models/{model}/infer", json.dumps(BODIES[model]).encode())


def rebuilds(url: str, model: str) -> float:
    return metric(url, "aclserve_instance_rebuilds_total", f'model="{model}",version="1"')


def test_a_model_scoped_count_fails_that_many_batches_of_the_model_across_rebuilds(tmp_path, make_config,
                                                                                   clean_faults):
    """double is compiled by the server (its OM named double-<key>), affine served as an OM of its
    own (named affine); one instance each, so a failed batch is answered 500 and rebuilds it."""
    models = tmp_path / "models"
    models.mkdir()
    double_onnx(models / "double.onnx")
    compile_cpu_om(affine_onnx(tmp_path / "affine.onnx"), models / "affine.om")
    srv = ServerThread(make_config(models)).start()
    try:
        for scoped, other in (("double", "affine"), ("affine", "double")):
            faults.inject(**faults.parse(f"execute:model={scoped},count=3")[0])
            answers = [(infer(srv.url, scoped), infer(srv.url, other)) for _ in range(5)]
            assert answers == [(500, 200)] * 3 + [(200, 200)] * 2, scoped
            assert (rebuilds(srv.url, scoped), rebuilds(srv.url, other)) == (3, 3 if other == "double" else 0)
    finally:
        srv.close()
