"""The Python API for embedding aclserve without HTTP.

    with aclserve.Engine(device="auto") as engine:
        model = engine.load("models/digits.om")
        probs = model.infer({"x": batch})["y"]           # synchronous
        probs = (await model.infer_async({"x": batch}))["y"]
        future = model.submit({"x": batch})              # concurrent.futures.Future

A request of N rows runs in the smallest compiled gear that holds it (padding is dropped);
more rows than the largest gear are split into several runs and the outputs concatenated.
Calls from many threads or tasks share the model's instances and slots; they are not merged
into one batch (the HTTP server's dynamic batcher does that).
"""
from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import os
from typing import Mapping

import numpy as np

from .acl_runtime import AclRuntime
from .pool import InstancePool, open_pool
from .types import TensorSpec


class EngineModel:
    """A loaded model. Owned by its Engine; close() unloads it (blocking)."""

    def __init__(self, pool: InstancePool):
        self.pool = pool
        self.name = pool.name
        self.inputs: list[TensorSpec] = pool.inputs
        self.outputs: list[TensorSpec] = pool.outputs
        self.gears = pool.gears

    def submit(self, inputs: Mapping[str, np.ndarray]) -> concurrent.futures.Future:
        """Start inference; the future resolves to {output name: array}. Never blocks."""
        arrays = self._validate(inputs)
        if not self.gears:
            return _map_future(self.pool.submit([arrays], None), lambda results: results[0])
        rows = len(next(iter(arrays.values())))
        parts = []
        for start in range(0, rows, self.gears[-1]):
            chunk = {k: v[start:start + self.gears[-1]] for k, v in arrays.items()}
            n = len(next(iter(chunk.values())))
            gear = self.gears[bisect.bisect_left(self.gears, n)]
            parts.append(self.pool.submit([chunk], gear))
        return _gather(parts, self.outputs)

    def infer(self, inputs: Mapping[str, np.ndarray], timeout: float | None = None) -> dict[str, np.ndarray]:
        return self.submit(inputs).result(timeout)

    async def infer_async(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return await asyncio.wrap_future(self.submit(inputs))

    def _validate(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = {s.name for s in self.inputs}
        unknown = set(inputs) - names
        if unknown:
            raise ValueError(f"unknown input(s) {sorted(unknown)}; the model takes {sorted(names)}")
        arrays, rows = {}, None
        for spec in self.inputs:
            if spec.name not in inputs:
                raise ValueError(f"missing input {spec.name!r}")
            arr = np.ascontiguousarray(inputs[spec.name], dtype=spec.dtype)
            expected = spec.sample_shape if spec.batched else spec.shape
            got = arr.shape[1:] if spec.batched else arr.shape
            if tuple(got) != tuple(expected) or (spec.batched and arr.ndim == 0):
                want = ["N", *expected] if spec.batched else list(expected)
                raise ValueError(f"input {spec.name!r} has shape {list(arr.shape)}, expected {want}")
            if spec.batched:
                if rows is not None and len(arr) != rows:
                    raise ValueError("all inputs must have the same number of rows")
                rows = len(arr)
            arrays[spec.name] = arr
        if rows == 0:
            raise ValueError("inputs have no rows")
        return arrays

    def close(self) -> None:
        self.pool.close()


def _map_future(inner: concurrent.futures.Future, fn) -> concurrent.futures.Future:
    outer: concurrent.futures.Future = concurrent.futures.Future()

    def done(f):
        if f.exception() is not None:
            outer.set_exception(f.exception())
        else:
            outer.set_result(fn(f.result().outputs))
    inner.add_done_callback(done)
    return outer


def _gather(parts: list[concurrent.futures.Future], outputs: list[TensorSpec]) -> concurrent.futures.Future:
    outer: concurrent.futures.Future = concurrent.futures.Future()
    remaining = [len(parts)]

    def done(_):
        remaining[0] -= 1
        if remaining[0] or outer.done():
            failed = [p for p in parts if p.done() and p.exception() is not None]
            if failed and not outer.done():
                outer.set_exception(failed[0].exception())
            return
        results = [p.result().outputs[0] for p in parts]
        outer.set_result({s.name: np.concatenate([r[s.name] for r in results]) for s in outputs})
    for part in parts:
        part.add_done_callback(done)
    return outer


class Engine:
    """Owns an AclRuntime and the models loaded through it; closing it unloads them all."""

    def __init__(self, device: str = "auto", cpu_threads: int = 1, memory_reserve_fraction: float = 0.1):
        self.runtime = AclRuntime(device, cpu_threads, memory_reserve_fraction)
        self.models: list[EngineModel] = []

    def __enter__(self) -> "Engine":
        self.runtime.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def load(self, path: str | os.PathLike, name: str | None = None, instances: int = 1,
             devices: tuple[int, ...] = (0,), slots: int = 2, retry: bool = True, warmup: bool = True) -> EngineModel:
        """Load an OM (blocking) and, by default, run every gear once to warm it up."""
        self.runtime.start()
        path = os.fspath(path)
        name = name or os.path.splitext(os.path.basename(path))[0]
        pool = open_pool(self.runtime, path, name, instances=instances, devices=devices, slots=slots, retry=retry)
        if warmup:
            pool.warmup()
        model = EngineModel(pool)
        self.models.append(model)
        return model

    def close(self) -> None:
        while self.models:
            self.models.pop().close()
        self.runtime.close()
