"""A model whose warm-up run fails: on the warm-up's zeros (the reason names warmup_data: ones, which
serves it), or at a gear its OM declares and its graph does not serve (refused, not retried)."""
from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.asyncio
async def test_a_model_that_fails_on_the_warm_ups_zeros_says_so(make_repo, models_dir):
    """An integer division by its input: the warm-up's zeros fail it. The reason named neither the
    warm-up nor the model's own message, and the CPU runtime logged a traceback of its own code."""
    import onnx
    from onnx import TensorProto, helper
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Div", ["x", "x"], ["y"])], "idiv",
                              [vi("x", TensorProto.INT32, ["n", 2])], [vi("y", TensorProto.INT32, ["n", 2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), models_dir / "idiv.onnx")
    repo, events = await make_repo(start=False, model_control_mode="none", load_retry_initial_s=60.0,
                                   load_retry_max_s=60.0)
    await repo.start()
    (row,) = repo.index()
    assert row["state"] == "UNAVAILABLE" and "the warm-up run on zeros failed" in row["reason"], row
    assert "if the model cannot run on zeros, warmup_data: ones in its config" in row["reason"], row
    # ONNX Runtime's reason, which the device's message carries (acl.get_recent_err_msg); retried, as
    # on a device, whose fault on its data says no more
    assert ("failed with 507011: model execution failed on the device; the device says: the model failed in ONNX "
            "Runtime: ") in row["reason"] and "Integer division by zero" in row["reason"], row
    assert "(transient device error" in row["reason"], row


@pytest.mark.asyncio
async def test_a_model_whose_om_declares_a_gear_its_graph_does_not_serve_says_so_and_is_not_retried(
        make_repo, models_dir, tmp_path):
    """y = x[:2] in an OM of gears 1,2,4 (what the compile wrote when its test runs took 1 and 2
    only): its warm-up at gear 4 failed with 507011, said "the warm-up run on zeros failed ... (if
    the model cannot run on zeros, warmup_data: ones ...) (transient device error: retry N ...)",
    retried for good (found by a tester). The CPU runtime refuses the run as GE refuses a run's
    parameters, saying the model's own reason, and the load is not retried."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from aclserve.om import container
    from aclserve.om.compile import compile_model
    vi = helper.make_tensor_value_info
    inits = [numpy_helper.from_array(np.array([v], np.int64), name) for name, v in (("s", 0), ("e", 2), ("a", 0))]
    graph = helper.make_graph([helper.make_node("Slice", ["x", "s", "e", "a"], ["y"])], "capped",
                              [vi("x", TensorProto.FLOAT, ["n", 3])], [vi("y", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "capped.onnx")
    om = container.read(compile_model(tmp_path / "capped.onnx", tmp_path / "capped.om", batch=[1, 2], target="cpu",
                                      log=lambda line: None).path)
    header = {key: value for key, value in om.header.items() if key != "payload_sha256"}
    container.write(models_dir / "capped.om", dict(header, gears=[1, 2, 4]), om.payload)
    repo, events = await make_repo(start=False, model_control_mode="none", load_retry_initial_s=0.2,
                                   load_retry_max_s=0.4)
    await repo.start()
    (row,) = repo.index()
    assert row["state"] == "UNAVAILABLE" and row["reason"] == (
        "the warm-up run failed: batch of 4 rows (gear 4) failed on device 0, instance capped:1#0: "
        "acl.rt.synchronize_event_with_timeout failed with 145000: model parameter invalid (e.g. a buffer smaller "
        "than the tensor); the device says: the model's graph computes output 'y' as [2, 3] at batch 4, where its "
        "OM declares [4, 3]: the OM's header and its graph disagree (compiled for a batch size it does not serve)")
    # (no "(transient device error: retry 1 in ...)": no retry armed, refused until its file changes)
    assert repo._failures.refused_for_good("capped")


@pytest.mark.asyncio
async def test_a_model_that_cannot_run_on_zeros_warms_up_on_ones(make_repo, models_dir):
    """Such a model could never load (retried for good as a device fault, every request 503):
    with `warmup_data: ones` it serves (found by an independent check)."""
    import onnx
    from onnx import TensorProto, helper
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Div", ["a", "b"], ["y"])], "idiv",
                              [vi("a", TensorProto.INT64, ["n", 2]), vi("b", TensorProto.INT64, ["n", 2])],
                              [vi("y", TensorProto.INT64, ["n", 2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), models_dir / "idiv.onnx")
    (models_dir / "idiv.yaml").write_text("warmup_data: ones\n")
    repo, _ = await make_repo(model_control_mode="none")
    result = await repo.get("idiv").infer({"a": np.array([[7, 9]]), "b": np.array([[2, 3]])}, 1)
    assert result.outputs["y"].tolist() == [[3, 3]]
    # 3 rows run in gear 4: its padding row was zeros, and every padded batch failed (found by a review)
    result = await repo.get("idiv").infer({"a": np.array([[7, 9]] * 3), "b": np.array([[2, 3]] * 3)}, 3)
    assert result.outputs["y"].tolist() == [[3, 3]] * 3
