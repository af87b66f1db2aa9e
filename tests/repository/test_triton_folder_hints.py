"""What a Triton user's folder is told (a tester's walk, t99): a config.pbtxt whose max_batch_size leaves
a wide gap between two compiled batch sizes says so at load, and a Triton folder whose .onnx keeps a
variable dimension is told the config.pbtxt way as well as the YAML key. The real repository and
server, the CPU runtime, onnx.helper models."""
from __future__ import annotations

import logging

import pytest

from aclserve.repository import State

from .repo_helpers import http_index, started_on_old_files, write_in
from .test_pbtxt_variable_dims import double_onnx, tensors


@pytest.mark.asyncio
async def test_a_wide_gap_between_compiled_batch_sizes_is_said_at_load(models_dir, caplog):
    """max_batch_size 1024 compiles 1,2,4,8,16,32,1024: a lone 33-row request ran padded to 1024 rows
    without a word. One INFO line names the sizes and the preferred_batch_size that fills the gap;
    the default sizes (max_batch_size 8) say nothing."""
    for name, cap in (("wide", 1024), ("narrow", 8)):
        double_onnx(models_dir / name / "1" / "model.onnx", ["N", 4])
        write_in(models_dir / name / "config.pbtxt", f"max_batch_size: {cap}\n" + tensors("[ 4 ]", "[ 4 ]"))
    caplog.set_level(logging.INFO, logger="aclserve")
    runner, _, _, _, repo = await started_on_old_files(models_dir)
    try:
        assert repo.get("wide").gears == (1, 2, 4, 8, 16, 32, 1024)
        assert repo.get("narrow").gears == (1, 2, 4, 8)
    finally:
        await runner.cleanup()
    said = [r.getMessage() for r in caplog.records if "compiles batch sizes" in r.getMessage()]
    assert said == ["models folder: wide/config.pbtxt: max_batch_size 1024 compiles batch sizes 1, 2, 4, 8, 16, 32, "
                    "1024: a batch of 33 to 1023 rows runs padded to 1024; add sizes between them with "
                    "dynamic_batching { preferred_batch_size: [ 64, 128, 256, 512 ] }"], said
    assert all(r.levelno == logging.INFO for r in caplog.records if "compiles batch sizes" in r.getMessage())


@pytest.mark.asyncio
async def test_a_triton_folder_with_a_variable_dimension_is_told_the_config_pbtxt_way(models_dir):
    """m/1/model.onnx of [N, L], no config: told only compile.input_shape, a YAML key, where its
    Triton user looks for a config.pbtxt field. The way it names serves."""
    double_onnx(models_dir / "seq" / "1" / "model.onnx", ["N", "L"])
    runner, _, base, _, _ = await started_on_old_files(models_dir)
    try:
        state, reason = (await http_index(base))["seq", "1"]
    finally:
        await runner.cleanup()
    assert state == State.UNAVAILABLE.value
    assert reason.startswith("input 'x' dim 1 is dynamic (L); fix it with compile.input_shape"), reason
    assert reason.endswith(
        '; or, in a config.pbtxt beside its version folders, max_batch_size over 0 and every input listed with its '
        "data_type and its dims without the batch, each variable one given its size (an FP32 x of [N, L]: input "
        '[ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] } ])'), reason
    # (what it says serves: test_pbtxt_variable_dims's "fixed", a config.pbtxt of that input and dims [ 5 ])
