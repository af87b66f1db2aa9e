"""A compile cache entry whose bytes changed but not its size is compiled again: the manifest's
sha256 is what tells it (a size check alone serves another model, or a flipped bit, as this one)."""
from __future__ import annotations

import shutil

import pytest

from .repo_helpers import place, x_rows


def _entry(models_dir):
    (om,) = (models_dir / ".cache").glob("o-*.om")
    return om


async def _compiled_entry(make_repo, models_dir, onnx: str) -> bytes:
    """The bytes of the cache entry a repository compiles for `onnx` placed as "o" (cache emptied first)."""
    shutil.rmtree(models_dir / ".cache", ignore_errors=True)
    place(onnx, models_dir / "o.onnx")
    repo, _ = await make_repo(model_control_mode="explicit")
    await repo.close()
    return _entry(models_dir).read_bytes()


async def _answer(make_repo) -> float:
    repo, _ = await make_repo(model_control_mode="explicit")
    return float((await repo.get("o").infer(x_rows(), 1)).outputs["y"][0, 0])


@pytest.mark.asyncio
async def test_an_entry_swapped_for_another_models_of_the_same_size_is_compiled_again(make_repo, models_dir,
                                                                                     model_files):
    """y = 3x compiled as "o" with the same options is a sound OM of o's entry's size: only its sha256 differs."""
    other = await _compiled_entry(make_repo, models_dir, model_files[3]["onnx"])
    own = await _compiled_entry(make_repo, models_dir, model_files[2]["onnx"])
    assert len(other) == len(own) and other != own
    _entry(models_dir).write_bytes(other)
    assert await _answer(make_repo) == 2.0
    assert _entry(models_dir).read_bytes() != other


@pytest.mark.asyncio
async def test_an_entry_with_a_flipped_bit_is_compiled_again(make_repo, models_dir, model_files):
    """Served as it is, the flipped bit fails the load (the OM's own checksums): the cache heals it instead."""
    own = bytearray(await _compiled_entry(make_repo, models_dir, model_files[2]["onnx"]))
    om = _entry(models_dir)
    own[len(own) // 2] ^= 0x01
    om.write_bytes(bytes(own))
    assert await _answer(make_repo) == 2.0
    assert _entry(models_dir).read_bytes() != bytes(own)
