"""The batch sizes a config.pbtxt's max_batch_size compiles an .onnx with, said where two of them are far
apart: `max_batch_size: 1024` compiles 1,2,4,8,16,32,1024, so a lone request of 33 rows runs padded to 1024
rows, 31 times the work, without a word (a Triton user's config, t99: Triton allocates per request)."""
from __future__ import annotations

from pathlib import Path

from ..config import PBTXT, ModelConfig

GAP_RATIO = 4  # a size more than this many times the one before it is said


def gap_note(config_path: Path, served: list[str], root: Path, config: ModelConfig) -> list[str]:
    """The note (one, or none) naming the sizes a config.pbtxt compiles the .onnx files `served` with, when
    one is more than GAP_RATIO times the one before it, and how to add sizes between them."""
    sizes = sorted(config.compile.batch or ())
    if config_path.name != PBTXT or not config.batch_from_pbtxt or not any(p.endswith(".onnx") for p in served):
        return []
    gaps = [(low, high) for low, high in zip(sizes, sizes[1:]) if high > GAP_RATIO * low]
    if not gaps:
        return []
    between = "; ".join(f"a batch of {low + 1} to {high - 1} rows runs padded to {high}" for low, high in gaps)
    filled = [size for low, high in gaps for size in _doubling(low, high)]
    return [f"{config_path.relative_to(root)}: max_batch_size {config.batching.batch_cap} compiles batch sizes "
            f"{', '.join(map(str, sizes))}: {between}; add sizes between them with dynamic_batching "
            f"{{ preferred_batch_size: [ {', '.join(map(str, filled))} ] }}"]


def _doubling(low: int, high: int) -> list[int]:
    """Sizes doubling from `low` up to below `high`: 32, 1024 -> 64, 128, 256, 512."""
    sizes, size = [], low * 2
    while size < high:
        sizes.append(size)
        size *= 2
    return sizes
