"""A dropped .onnx exported in training mode (a Dropout's training_mode a constant true: PyTorch's
training=TrainingMode.TRAINING, a tester's, t96) is not served: its index reason is the compile's
refusal, word for word. The real repository on the CPU runtime, an onnx.helper model."""
from __future__ import annotations

import pytest

from aclserve.repository import ModelLoadFailed
from tests.tiny_models import dropout_onnx


@pytest.mark.asyncio
async def test_a_dropped_onnx_in_training_mode_is_refused_with_the_compiles_words(make_repo, models_dir):
    dropout_onnx(models_dir / "drop.onnx", True)
    repo, _ = await make_repo(start=False, model_control_mode="explicit")
    await repo.start()
    with pytest.raises(ModelLoadFailed):
        await repo.load("drop")
    (row,) = repo.index()
    assert (row["state"], row["reason"]) == ("UNAVAILABLE", "Dropout node '/dropout/Dropout' is in training mode: "
                                             "every answer would be dropped out at random; the usual cause is an "
                                             "export without model.eval() (torch.onnx.export(..., "
                                             "training=TrainingMode.TRAINING)); export it again after model.eval() "
                                             "(a model meant to drop out as it serves, Monte-Carlo dropout, writes "
                                             "its mask with RandomUniformLike, which compiles as a sampling model: "
                                             "its answers vary from run to run)")
