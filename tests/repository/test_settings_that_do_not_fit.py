"""A model's settings that cannot apply to the model loaded, or to the host: the load fails with
the reason in the index, or the log names what is passed over (found by an independent check)."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from aclserve.repository import State
from tests.tiny_models import compile_cpu_om, scale_onnx

from .repo_helpers import place, serving

pytestmark = pytest.mark.asyncio


def index_of(repo) -> dict:
    return {(r["name"], r["version"]): (r["state"], r["reason"]) for r in repo.index()}


async def test_a_device_the_host_has_not_fails_the_load_whatever_the_instances(make_repo, models_dir, model_files,
                                                                                runtime):
    """`devices: [0, 5]` with one instance loaded READY on a host of one device (/config showing
    devices "0,5") and failed only once an instance was placed on device 5."""
    count = runtime.device_count()
    place(model_files[1]["om"], models_dir / "m.om")
    (models_dir / "m.yaml").write_text(f"devices: [0, {count + 3}]\ninstances: 1\n")
    place(model_files[1]["om"], models_dir / "fits.om")
    (models_dir / "fits.yaml").write_text(f"devices: {list(range(count))}\ninstances: 1\n")
    repo, _ = await make_repo(model_control_mode="none")
    assert serving(repo) == ["fits"]
    state, reason = index_of(repo)[("m", "1")]
    assert state == State.UNAVAILABLE and f"devices [0, {count + 3}]: this host has no device {count + 3}" in reason


@pytest.fixture(scope="module")
def static_om(tmp_path_factory):
    """y = x * 2 compiled without batch sizes: x [1, 4], one request per run."""
    folder = tmp_path_factory.mktemp("static")
    return compile_cpu_om(scale_onnx(folder / "s.onnx", 2.0), folder / "s.om", batch="1")


async def test_batching_a_static_model_cannot_take_fails_its_own_config_and_is_named_from_model_defaults(
        make_repo, models_dir, static_om, caplog):
    """`batching: {max_batch_size: 8, max_queue_delay_ms: 5}` in a static model's config.yaml, and
    `max_batch_size: 4` with `dynamic_batching { }` in its config.pbtxt, loaded READY without a
    word (an independent check): the model's own max_batch_size fails the load, as Triton refuses
    it for a model without a batch dimension; model_defaults' never fails a model, and what does
    not apply is named in an INFO line."""
    caplog.set_level(logging.INFO, logger="aclserve.repository.served")
    place(static_om, models_dir / "own.om")
    (models_dir / "own.yaml").write_text("batching: {max_batch_size: 8, max_queue_delay_ms: 5}\n")
    place(static_om, models_dir / "triton" / "1" / "model.om")
    (models_dir / "triton" / "config.pbtxt").write_text("max_batch_size: 4\ndynamic_batching { }\n")
    place(static_om, models_dir / "window.om")
    (models_dir / "window.yaml").write_text("batching: {max_queue_delay_ms: 5}\n")
    place(static_om, models_dir / "inherits.om")
    # (make_repo's model_defaults give max_queue_delay_ms 0.5)
    repo, _ = await make_repo(model_control_mode="none", **{"model_defaults.batching.max_batch_size": 8})
    assert serving(repo) == ["inherits", "window"]
    index = index_of(repo)
    said = ("cannot apply: the model has no batch dimension (compiled without batch sizes, it runs one request at a "
            "time); set 0 or remove it (Triton refuses a max_batch_size over 0 for such a model too)")
    assert index[("own", "1")] == (State.UNAVAILABLE, f"own.yaml: batching.max_batch_size 8 {said}")
    assert index[("triton", "1")] == (State.UNAVAILABLE, f"config.pbtxt: max_batch_size 4 {said}")
    passed = [r.getMessage() for r in caplog.records if "passed over" in r.getMessage()]
    tail = "passed over: the model has no batch dimension (compiled without batch sizes, it runs one request at a time)"
    assert sorted(passed) == [
        f"inherits:1: batching max_batch_size 8 (model_defaults', or --max-batch) and max_queue_delay_ms 0.5 {tail}",
        f"window:1: batching max_batch_size 8 (model_defaults', or --max-batch) and max_queue_delay_ms 5 {tail}"]
    assert (await repo.get("window").infer({"x": np.ones((1, 4), np.float32)}, 1)).outputs["y"].tolist() == [[2.0] * 4]
