"""Real CPU OMs (y = x * scale) for the repository tests, and a repository under test (on the
started CPU runtime of tests/conftest.py).

Models are compiled once per session with aclserve.om.compile and copied into each test's
models folder; the scale tells the versions apart in the responses.
"""
from __future__ import annotations

import pytest
import pytest_asyncio

from aclserve.config import load_server_config
from aclserve.repository import ModelRepository
from tests.tiny_models import compile_cpu_om, scale_onnx

from .repo_helpers import Events, until_settled


@pytest.fixture(scope="session")
def model_files(tmp_path_factory):
    """scale -> {"om": path, "onnx": path} for scales 1, 2, 3 (compiled once)."""
    folder = tmp_path_factory.mktemp("om-build")
    out = {}
    for scale in (1, 2, 3):
        src = scale_onnx(folder / f"scale{scale}.onnx", float(scale))
        out[scale] = {"om": compile_cpu_om(src, folder / f"scale{scale}.om", batch="1,2,4"), "onnx": src}
    return out


@pytest.fixture
def models_dir(tmp_path):
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest_asyncio.fixture
async def make_repo(models_dir, runtime):
    made = []

    async def make(start: bool = True, clock=None, wall_clock=None, config_file=None, **overrides):
        """clock, wall_clock: the settle gate's (time.monotonic, time.time by default); the wall
        clock is what the first scan reads to judge a file's age. config_file: a server config
        file under the overrides. settle_s is short: files placed before a start are fresh, and the
        first scan waits it out for them (renames while it runs are taken at once); a test whose
        point is a settle wait sets its own, or a fake clock."""
        settings = {"models_dir": str(models_dir), "settle_s": 0.1, "debounce_s": 0.05, "readiness": "lenient",
                    "shutdown_timeout_s": 10, "model_defaults.batching.max_queue_delay_ms": 0.5}
        settings.update(overrides)
        clocks = {key: c for key, c in (("clock", clock), ("wall_clock", wall_clock)) if c is not None}
        repo = ModelRepository(load_server_config(config_file, settings), runtime, **clocks)
        events = Events()
        repo.add_listener(events)
        made.append(repo)
        if start:
            await repo.start()
            # files placed just before start settle first (their mtime is fresh): wait for them, until
            # each model serves or was refused (a folder of refused files only is never ready)
            await until_settled(repo, events)
        return repo, events

    yield make
    for repo in made:
        await repo.close()
