"""Hot reload under continuous load (poll mode, real watcher, real runtime on the CPU runtime).

Clients send requests without pause while files are replaced (rename, slow in-place write),
versions added, corrupt files dropped and models deleted: no request may fail (except for a
deleted model), and the responses (y = x * scale) show which version answered. Ordering is
checked causally with phases set by the test, never with durations.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path

import numpy as np
import pytest
from .repo_helpers import place, serving, x_rows

from aclserve.errors import ModelUnavailable, NotFound, ServeError, ShuttingDown
from aclserve.om import container
from tests import REPO
from tests.tiny_models import compile_cpu_om
from aclserve.repository import State

pytestmark = pytest.mark.asyncio


class Clients:
    """`n` tasks calling repo.get(name).infer in a loop; each answer is recorded with the test
    phase at its start and at its end."""

    def __init__(self, repo, name, n=4):
        self.repo, self.name = repo, name
        self.phase = 0
        self.answers: list[tuple[int, int, float]] = []  # (phase at start, phase at end, scale)
        self.failures: list[BaseException] = []
        self._stop = False
        self._progress = asyncio.Event()
        self._tasks = [asyncio.create_task(self._client(i)) for i in range(n)]

    async def _client(self, i):
        rows = 1 + i % 3
        while not self._stop:
            start = self.phase
            try:
                result = await self.repo.get(self.name).infer(x_rows(rows), rows)
                self.answers.append((start, self.phase, float(result.outputs["y"][0, 0])))
            except ServeError as e:
                self.failures.append(e)
            self._progress.set()
            await asyncio.sleep(0)

    async def wait_for_answers(self, count, phase):
        """Wait until `count` answers were started in `phase` or later."""
        async def until():
            while sum(1 for a in self.answers if a[0] >= phase) < count:
                self._progress.clear()
                await self._progress.wait()
        await asyncio.wait_for(until(), 120)

    def scales(self, started_from=0, ended_before=None):
        return {s for a, b, s in self.answers
                if a >= started_from and (ended_before is None or b < ended_before)}

    async def stop(self):
        self._stop = True
        await asyncio.gather(*self._tasks)


class WriterClock:
    """The settle gate's clock: time.monotonic, except that during `writing(pause_s)` it runs at
    most pause_s past the last chunk written. A loaded machine may stall the writer past settle_s
    between two chunks, and the gate rightly takes a file unchanged that long: the partial file
    was loaded. With this clock the gate sees the pauses the writer means, never longer."""

    def __init__(self):
        self._behind = 0.0  # how far this clock is behind time.monotonic
        self._limit: float | None = None  # while writing: the reading it stops at
        self._pause_s = 0.0

    def __call__(self) -> float:
        now = time.monotonic() - self._behind
        return now if self._limit is None else min(now, self._limit)

    @contextlib.contextmanager
    def writing(self, pause_s: float):
        self._pause_s = pause_s
        self.wrote()
        try:
            yield
        finally:
            self._stop_at(None)

    def wrote(self) -> None:
        """A chunk was written: the clock may run pause_s from here."""
        self._stop_at(self() + self._pause_s)

    def _stop_at(self, limit: float | None) -> None:
        if self._limit is not None:  # the time it stood still is not made up
            self._behind += max(0.0, time.monotonic() - self._behind - self._limit)
        self._limit = limit


async def slow_write(path, data: bytes, clock: WriterClock, chunks=12, pause_s=0.02):
    """`chunks` writes `pause_s` apart, as `clock` sees them (12 x 20 ms: each pause under settle_s, 0.1 s)."""
    step = -(-len(data) // chunks)
    with clock.writing(pause_s), open(path, "wb") as f:
        for i in range(0, len(data), step):
            f.write(data[i:i + step])
            f.flush()
            clock.wrote()
            await asyncio.sleep(pause_s)


async def test_replace_by_rename_by_slow_write_and_new_version_fail_nothing(make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "m.om")
    clock = WriterClock()
    repo, events = await make_repo(clock=clock)
    clients = Clients(repo, "m")
    await clients.wait_for_answers(20, 0)

    # 1. copy + rename: the new version takes over once swapped in
    place(model_files[2]["om"], models_dir / "m.om")
    await events.wait("reloaded", "m", "1", count=1)
    clients.phase = 1
    await clients.wait_for_answers(20, 1)

    # 2. slow chunked write in place: nothing changes until the file is complete
    clients.phase = 2
    await slow_write(models_dir / "m.om", Path(model_files[3]["om"]).read_bytes(), clock)
    clients.phase = 3
    await events.wait("reloaded", "m", "1", count=2)
    clients.phase = 4
    await clients.wait_for_answers(20, 4)
    await clients.stop()

    assert clients.failures == []
    assert clients.scales(0, ended_before=1) <= {1.0, 2.0}
    assert clients.scales(1, ended_before=3) == {2.0}  # the half-written file never answered
    assert clients.scales(4) == {3.0}
    assert events.count("load_failed", "m") == 0  # the partial file was never even tried
    assert events.count("reloaded", "m") == 2


async def test_new_version_takes_over_and_the_old_one_drains(make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "v" / "1" / "model.om")
    repo, events = await make_repo()
    clients = Clients(repo, "v")
    await clients.wait_for_answers(20, 0)
    place(model_files[2]["om"], models_dir / "v" / "2" / "model.om")
    await events.wait("loaded", "v", "2")
    clients.phase = 1
    await events.wait("unloaded", "v", "1")
    await clients.wait_for_answers(20, 1)
    await clients.stop()
    assert clients.failures == []
    assert clients.scales(1) == {2.0}
    assert [r["version"] for r in repo.index(ready_only=True)] == ["2"]


async def test_corrupt_and_truncated_files_keep_the_old_version_serving(make_repo, models_dir, model_files, caplog):
    place(model_files[1]["om"], models_dir / "m.om")
    repo, events = await make_repo()
    clients = Clients(repo, "m")
    await clients.wait_for_answers(10, 0)
    caplog.set_level(logging.ERROR, logger="aclserve.repository.failures")

    data = Path(model_files[2]["om"]).read_bytes()
    truncated = models_dir / "elsewhere.bin"
    truncated.write_bytes(data[: len(data) - 100])
    os.replace(truncated, models_dir / "m.om")
    await events.wait("load_failed", "m", count=1)
    (row,) = [r for r in repo.index() if r["name"] == "m"]
    assert row["state"] == State.READY and "truncated" in row["reason"]

    # unrelated events make the repository rescan: the same bad file is not retried or re-logged
    for i in range(3):
        (models_dir / f"other{i}.txt").write_text("x")
        await asyncio.sleep(0.1)
    await repo.wait_idle()

    corrupt = bytearray(data)
    corrupt[-3] ^= 0xFF  # same length, bad payload checksum
    (models_dir / "tmp.bin").write_bytes(bytes(corrupt))
    os.replace(models_dir / "tmp.bin", models_dir / "m.om")
    await events.wait("load_failed", "m", count=2)
    clients.phase = 1
    await clients.wait_for_answers(10, 1)
    await clients.stop()

    assert clients.failures == []
    assert clients.scales() == {1.0}
    assert events.count("load_failed", "m") == 2
    assert len([r for r in caplog.records if "not loaded" in r.getMessage()]) == 2
    (row,) = [r for r in repo.index() if r["name"] == "m"]
    assert row["state"] == State.READY and "checksum" in row["reason"]

    place(model_files[3]["om"], models_dir / "m.om")  # a good file after bad ones is taken
    await events.wait("reloaded", "m")
    assert float((await repo.get("m").infer(x_rows(), 1)).outputs["y"][0, 0]) == 3.0
    (row,) = [r for r in repo.index() if r["name"] == "m"]
    assert row == {"name": "m", "version": "1", "state": State.READY, "reason": ""}


async def test_new_model_with_a_bad_file_shows_unavailable(make_repo, models_dir):
    repo, events = await make_repo()
    (models_dir / "x.bin").write_bytes(b"IMOD" + b"\0" * 10)
    os.replace(models_dir / "x.bin", models_dir / "bad.om")
    await events.wait("load_failed", "bad")
    rows = [r for r in repo.index() if r["name"] == "bad"]
    assert rows[0]["state"] == State.UNAVAILABLE and rows[0]["reason"]


async def test_an_om_listing_no_outputs_says_so_in_the_index(make_repo, models_dir, model_files):
    """The reason was 145006's generic words; the cause was only in the log."""
    good = container.read(model_files[1]["om"])
    header = {k: v for k, v in good.header.items() if k != "payload_sha256"}
    (models_dir / "x.bin").write_bytes(container.encode(dict(header, outputs=[]), good.payload))
    repo, events = await make_repo()
    os.replace(models_dir / "x.bin", models_dir / "none.om")
    await events.wait("load_failed", "none")
    (row,) = [r for r in repo.index() if r["name"] == "none"]
    assert row["state"] == State.UNAVAILABLE and "CPU OM header lists no outputs" in row["reason"], row


async def test_delete_unloads_after_draining(make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "m.om")
    place(model_files[2]["om"], models_dir / "keep.om")
    repo, events = await make_repo()
    clients = Clients(repo, "m")
    await clients.wait_for_answers(10, 0)
    os.unlink(models_dir / "m.om")
    await events.wait("unloaded", "m")
    await clients.stop()
    # requests accepted before the delete were answered; later ones hear the model is gone
    assert {type(e) for e in clients.failures} <= {NotFound, ModelUnavailable}
    assert clients.scales() == {1.0}
    assert serving(repo) == ["keep"]
    assert not [r for r in repo.index() if r["name"] == "m"]


async def test_delete_keeps_serving_when_unload_on_delete_is_off(make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "m.om")
    repo, events = await make_repo(unload_on_delete=False)
    os.unlink(models_dir / "m.om")
    place(model_files[2]["om"], models_dir / "n.om")  # an event after the delete, as a gate
    await events.wait("loaded", "n")
    assert float((await repo.get("m").infer(x_rows(), 1)).outputs["y"][0, 0]) == 1.0


async def test_dropped_onnx_is_compiled_and_served_live(make_repo, models_dir, model_files):
    repo, events = await make_repo()
    place(model_files[2]["onnx"], models_dir / "o" / "1" / "model.onnx")
    await events.wait("loaded", "o", "1")
    assert float((await repo.get("o").infer(x_rows(), 1)).outputs["y"][0, 0]) == 2.0


async def test_replacing_a_dropped_onnx_leaves_one_compile_in_the_cache(make_repo, models_dir, model_files):
    repo, events = await make_repo()
    place(model_files[1]["onnx"], models_dir / "o.onnx")
    await events.wait("loaded", "o", "1")
    place(model_files[2]["onnx"], models_dir / "o.onnx")
    await events.wait("reloaded", "o", "1")
    await repo.wait_idle()  # the replaced version has drained, closed and dropped its compile
    assert float((await repo.get("o").infer(x_rows(), 1)).outputs["y"][0, 0]) == 2.0
    cached = sorted(p.name for p in (models_dir / ".cache").glob("o-*.om"))
    assert len(cached) == 1 and repo.get("o").om_path.endswith(cached[0])
    (models_dir / "o.onnx").unlink()
    await events.wait("unloaded", "o", "1")
    await repo.wait_idle()
    assert list((models_dir / ".cache").glob("o-*.om")) == []


async def test_unload_in_poll_mode_holds_until_load(make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "m.om")
    repo, events = await make_repo()
    await repo.unload("m")
    place(model_files[2]["om"], models_dir / "m.om")
    place(model_files[3]["om"], models_dir / "gate.om")
    await events.wait("loaded", "gate")
    await repo.wait_idle()
    assert serving(repo) == ["gate"]
    await repo.load("m")
    assert float((await repo.get("m").infer(x_rows(), 1)).outputs["y"][0, 0]) == 2.0


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def test_fifty_reloads_return_memory_to_baseline(make_repo, models_dir, model_files, runtime):
    place(model_files[1]["om"], models_dir / "m.om")
    repo, events = await make_repo()
    baseline = runtime.memory(refresh=True)
    clients = Clients(repo, "m", n=2)
    rss_start = None
    for i in range(50):
        place(model_files[2 if i % 2 == 0 else 1]["om"], models_dir / "m.om")
        await events.wait("reloaded", "m", count=i + 1)
        await repo.wait_idle()  # the replaced version has drained and closed
        if i == 4:
            rss_start = rss_bytes()  # after warm-up of allocators and caches
    await clients.stop()
    assert clients.failures == []
    assert runtime.memory(refresh=True) == baseline
    growth = rss_bytes() - rss_start
    assert growth < 64 * 1024 * 1024, f"RSS grew by {growth / 2**20:.1f} MiB over 45 reloads"


async def test_a_request_holding_a_retired_version_goes_to_its_successor(make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "m.om")
    repo, events = await make_repo()
    held = repo.get("m")  # as the server does, before reading the request body
    place(model_files[2]["om"], models_dir / "m.om")
    await events.wait("reloaded", "m")
    await repo.wait_idle()  # the held version has drained and its batcher and pool are closed
    result = await held.infer(x_rows(), 1)
    assert float(result.outputs["y"][0, 0]) == 2.0
    os.unlink(models_dir / "m.om")
    await events.wait("unloaded", "m")
    with pytest.raises((ModelUnavailable, ShuttingDown)):  # no successor for a deleted model
        await held.infer(x_rows(), 1)


async def test_a_held_request_is_refused_when_its_successor_would_not_answer_it_as_checked(
        make_repo, models_dir, model_files, tmp_path):
    """A request decoded for a version that was retired meanwhile goes to its successor only
    when that has the same signature, and is the same version unless the request named none
    (found by an independent check: a reloaded file with other input shapes answered such
    requests wrongly, or failed their whole batch; a request pinned to version 1 was answered by
    version 2, labelled 1). The result names the version that ran it."""
    other_gears = compile_cpu_om(model_files[2]["onnx"], tmp_path / "gears12.om", batch="1,2")
    place(model_files[1]["om"], models_dir / "m.om")
    place(model_files[1]["om"], models_dir / "v" / "1" / "model.om")
    repo, events = await make_repo()
    held, held_v1 = repo.get("m"), repo.get("v", "1")
    place(other_gears, models_dir / "m.om")  # the same version, another batch limit
    place(model_files[2]["om"], models_dir / "v" / "2" / "model.om")  # version 2 takes over
    await events.wait("reloaded", "m")
    await events.wait("unloaded", "v", "1")
    await repo.wait_idle()
    with pytest.raises(ModelUnavailable, match="model m version 1 was replaced by one with other inputs, input value ranges, outputs or batch limit"):
        await held.infer(x_rows(), 1)
    with pytest.raises(ModelUnavailable, match="model v version 1 was replaced by version 2 .* send it again"):
        await held_v1.infer(x_rows(), 1, pinned=True)
    handed = await held_v1.infer(x_rows(), 1)  # named no version: version 2 (same signature) answers
    assert handed.version == "2" and float(handed.outputs["y"][0, 0]) == 2.0
    assert float((await repo.get("m").infer(x_rows(), 1)).outputs["y"][0, 0]) == 2.0  # sent again: served


async def test_a_held_request_survives_an_edit_of_image_settings_alone(make_repo, models_dir):
    """Image settings change how pictures become tensors, not the model: a request decoded under
    the old ones is answered by the reloaded version when the model file is the same (found by an
    independent check: such an edit failed about 5 % of the requests in flight, with a message
    saying the inputs or outputs had changed), and refused, naming why, when the file changed too."""
    for name in ("digits_image.om", "digits_labels.txt"):
        place(os.path.join(REPO, "models", name), models_dir / name)
    settings = (Path(REPO) / "models" / "digits_image.yaml").read_text()
    (models_dir / "digits_image.yaml").write_text(settings)
    repo, events = await make_repo()
    held = repo.get("digits_image")
    pixels = {"x": np.full((1, 8, 8, 1), 200, np.uint8)}  # what the held version's plan made of a picture
    expected = (await held.infer(pixels, 1)).outputs["y"]
    (models_dir / "digits_image.yaml").write_text(settings.replace("interpolation: area", "interpolation: bilinear"))
    await events.wait("reloaded", "digits_image")
    await repo.wait_idle()
    assert repo.get("digits_image") is not held
    assert np.array_equal((await held.infer(pixels, 1)).outputs["y"], expected)
    held = repo.get("digits_image")
    place(os.path.join(REPO, "models", "digits_image.om"), models_dir / "digits_image.om")  # another file
    (models_dir / "digits_image.yaml").write_text(settings)
    await events.until(lambda: repo.get("digits_image").settings_key() != held.settings_key()
                       and repo.get("digits_image").model_key() != held.model_key())
    await repo.wait_idle()
    with pytest.raises(ModelUnavailable, match="replaced by another model file with other image or labels settings"):
        await held.infer(pixels, 1)


async def test_a_fixed_config_or_labels_file_is_taken_when_the_config_is_touched(make_repo, models_dir, model_files):
    """A version is its file served with its config and labels files: a load that failed for a
    labels file is tried again once that is fixed and the config touched (it stayed refused until
    the model file itself changed), and an edited labels file is taken at the next touch."""
    repo, events = await make_repo()
    labels = models_dir / "m_labels.txt"
    labels.write_text("a\nb\nc\n")  # the model's output has four classes
    (models_dir / "m.yaml").write_text("outputs: {y: {labels: m_labels.txt}}\n")
    place(model_files[1]["om"], models_dir / "m.om")
    await events.wait("load_failed", "m")

    def touch_config():
        stamp = (models_dir / "m.yaml").stat().st_mtime_ns + 10**9
        os.utime(models_dir / "m.yaml", ns=(stamp, stamp))

    labels.write_text("\ufeffa\nb\nc\nd\n", encoding="utf-8")  # a byte order mark, as Notepad writes
    touch_config()
    await events.wait("loaded", "m")
    assert repo.get("m").labels == {"y": ("a", "b", "c", "d")}
    labels.write_text("w\nx\ny\nz\n")
    touch_config()
    await events.wait("reloaded", "m")
    assert repo.get("m").labels == {"y": ("w", "x", "y", "z")}


async def test_a_reload_says_what_changed(make_repo, models_dir, model_files, caplog):
    """A reload was logged as "version 1 ready", as a first load: an operator who edited the
    config could not tell from the log that it was taken."""
    place(model_files[1]["om"], models_dir / "m.om")
    repo, events = await make_repo()
    with caplog.at_level(logging.INFO, logger="aclserve.repository"):
        (models_dir / "m.yaml").write_text("batching: {max_queue_delay_ms: 2}\n")
        await events.wait("reloaded", "m", "1", count=1)
        place(model_files[2]["om"], models_dir / "m.om")
        await events.wait("reloaded", "m", "1", count=2)
    assert "m: version 1 reloaded (its new config), the one before drains" in caplog.text
    assert "m: version 1 reloaded (its new file), the one before drains" in caplog.text
