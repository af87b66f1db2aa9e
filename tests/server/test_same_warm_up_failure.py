"""A model that cannot run on zeros was retried for ever as a "transient device error": y = Div(a, b)
of INT32, dropped in without `warmup_data`, fails its warm-up in ONNX Runtime, which the CPU runtime
reports as 507011 (model execution failed), a code a device fault gives too. Its index reason ended
`(transient device error: retry 5 in 1.6 s)` and aclserve_model_load_retries_total grew, the retries
backing off to 60 s, for good (a tester's walk of the README). Now a warm-up run failing the same way
(code and the device's words) at three attempts in a row or more, over `load_retry_max_s` at least
(a small one here: not a minute), is the model's: not retried until its file or config changes or a
load call asks."""
from __future__ import annotations

import json
import re
import shutil

from onnx import TensorProto, helper

from aclserve.acl.cpu import faults
from tests.serving import ServerThread, index_of, json_call, wait_until
from tests.tiny_models import compile_cpu_om, save_graph

from .hostile import metric

RETRIES = 'model="div"'
# the stopped reason's end, with the attempts in a row (three at least) and the seconds they spanned
STOPPED = re.compile(r"\(failed the same way ([3-9]|\d\d+) times in a row over \d+\.\d s: the model's failure, not a "
                     r"transient device error; not retried: a change of the file or its config, or a load call, "
                     r"tries it again\)$")


def _div_onnx(path) -> str:
    """y = Div(a, b), INT32 [batch, 2]: a warm-up on zeros divides by zero."""
    vi = helper.make_tensor_value_info
    inputs = [vi(name, TensorProto.INT32, ["batch", 2]) for name in ("a", "b")]
    return save_graph(helper.make_graph([helper.make_node("Div", ["a", "b"], ["y"])], "div", inputs,
                                        [vi("y", TensorProto.INT32, ["batch", 2])]), path)


def _quick_retries(make_config, models):
    """A poll-mode config whose retries back off from 0.05 s to load_retry_max_s 0.1 s (not a minute)."""
    return make_config(models, model_control_mode="poll", settle_s=0.1, load_retry_initial_s=0.05,
                       load_retry_max_s=0.1)


def _stopped_retrying(srv, model: str) -> str:
    """Version 1 of `model`'s index reason, once it says it is not retried."""
    def reason() -> str:
        return index_of(srv).get((model, "1"), ("", ""))[1]
    wait_until(lambda: "not retried" in reason(), "stopped retrying the model", guard_s=60)
    return reason()


def test_a_warm_up_failing_the_same_way_for_max_s_is_not_retried_until_its_config_changes(tmp_path, make_config):
    models = tmp_path / "models"
    models.mkdir()
    compile_cpu_om(_div_onnx(tmp_path / "div.onnx"), models / "div.om")
    with ServerThread(_quick_retries(make_config, models)) as srv:
        said = _stopped_retrying(srv, "div")
        stopped = STOPPED.search(said)
        assert "Integer division by zero" in said and "warmup_data: ones" in said and stopped, said
        attempts = int(stopped[1])
        assert metric(srv.url, "aclserve_model_load_retries_total", RETRIES) == attempts - 1  # (the first: no retry)
        status, answer = json_call(srv.url, "/v2/repository/models/div/load", b"{}")  # a load call tries again
        assert status == 400 and f"failed the same way {attempts + 1} times in a row" in answer["error"], answer
        assert metric(srv.url, "aclserve_model_load_retries_total", RETRIES) == attempts - 1
        (models / "div.yaml").write_text("warmup_data: ones\n")  # the remedy the reason names
        wait_until(lambda: index_of(srv).get(("div", "1"), ("",))[0] == "READY", "loaded the model on ones")
        body = {"inputs": [{"name": "a", "datatype": "INT32", "shape": [1, 2], "data": [6, 9]},
                           {"name": "b", "datatype": "INT32", "shape": [1, 2], "data": [3, 2]}]}
        status, answer = json_call(srv.url, "/v2/models/div/infer", json.dumps(body).encode())
        assert status == 200 and answer["outputs"][0]["data"] == [2, 4], answer


def test_a_file_the_acl_never_reads_while_the_server_does_is_not_retried_for_good(tmp_path, make_config, models_dir,
                                                                                   clean_faults):
    """query_size failing 145002 (model file missing or unreadable) at every load while the server
    reads the file: taken for the host short of descriptors at first (runtime/unread_file.py), but
    a device's GE answers 145002 for a path or length check it fails too, so the same failure again
    and again over `load_retry_max_s` is the file's, as a warm-up's is (a review found it retried
    every max_s for good)."""
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(models_dir / "double.om", models / "double.om")
    faults.inject("query_size", code=145002)  # every call
    with ServerThread(_quick_retries(make_config, models)) as srv:
        said = _stopped_retrying(srv, "double")
        assert "could not be read" in said and "and reads now" in said and STOPPED.search(said), said
