"""A model's config file is parsed once while it is unchanged, not at every scan, and one over
MAX_CONFIG_BYTES is refused unread (tester t92: a broken 1 MB YAML beside a served model cost the
idle server 9.3 s of CPU every 40 s, its p99 from 11 to 53 ms; a 28.7 MB one held the scan three
minutes). The parses are counted as the kernel sees them, by the opens of each file (inotify),
not as the server says them."""
from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from watchdog.events import FileClosedNoWriteEvent, FileSystemEventHandler
from watchdog.observers import Observer

from aclserve.config import MAX_CONFIG_BYTES, ConfigError, ModelConfig, load_server_config
from aclserve.repository import State
from aclserve.repository.config_reads import FRESH_S, ConfigReads
from aclserve.repository.layout import scan
from aclserve.repository.planner import Planner
from aclserve.repository.settle import SettleGate

from .repo_helpers import place, write_in

DEFAULTS = ModelConfig()
LIMIT_S = 60.0  # a hang guard, not a timing check
BROKEN_YAML = "instances: 1\nx_list:\n" + "".join(f"  - [{i}, {i}, {i}]\n" for i in range(50))  # t92's, shorter


def ahead() -> float:
    return time.time() + 60  # every file a minute old: none is too fresh to keep (config_reads.FRESH_S)


class Opens(FileSystemEventHandler):
    """The reads of the files under `folder`: opens for reading closed, as inotify reports them
    (a test's own writes are not counted). settle() reads a hidden file of its own and waits for
    its event: one watch's events come in order, so every read before it has been counted then;
    and inotify merges an event with the same one just before it not yet taken, so a test
    settles between two scans (each read once by a scan, counted once)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._mark = folder / ".mark"  # (hidden: the scans pass it over)
        self._mark.write_bytes(b"")
        self._marks = 0
        self._counts: Counter = Counter()
        self._changed = threading.Condition()
        self._observer = Observer()
        self._observer.schedule(self, str(folder), recursive=True, event_filter=[FileClosedNoWriteEvent])
        self._observer.start()  # (the watches are in place once it returns)

    def on_closed_no_write(self, event) -> None:
        with self._changed:
            self._counts[os.fsdecode(event.src_path)] += 1
            self._changed.notify_all()

    def settle(self) -> None:
        self._mark.open("rb").close()
        self._marks += 1
        with self._changed:
            assert self._changed.wait_for(lambda: self._counts[str(self._mark)] >= self._marks, LIMIT_S)

    def of(self, path: Path) -> int:
        self.settle()
        with self._changed:
            return self._counts[str(path)]

    def close(self) -> None:
        self._observer.stop()
        self._observer.join()


@pytest.fixture
def models(tmp_path):
    folder = tmp_path.resolve() / "models"  # (the scan opens the files by their real path)
    folder.mkdir()
    return folder


@pytest.fixture
def opens():
    """opens(folder): an Opens of `folder` (its real path), closed at the end of the test."""
    made = []

    def start(folder: Path) -> Opens:
        made.append(Opens(folder.resolve()))
        return made[-1]
    yield start
    for each in made:
        each.close()


async def rescans(planner: Planner, counted: Opens, times: int) -> list:
    """`times` scans of `planner`'s folder, the reads of each counted before the next (Opens)."""
    found = []
    for _ in range(times):
        found.append(await planner.rescan())
        counted.settle()
    return found


def touch(path: Path, data: bytes | str = b"om") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


@pytest.mark.asyncio
async def test_a_config_is_parsed_once_while_unchanged_its_refusal_too(models, opens):
    configs = {"a": touch(models / "a.yaml", BROKEN_YAML),
               "b": touch(models / "b" / "config.pbtxt", "max_batch_size: x\n"),
               "c": touch(models / "c" / "config.pbtxt", "max_batch_size: 4\n"),
               "d": touch(models / "d.yaml", "instances: 2\n")}
    for model in (models / "a.om", models / "b" / "1" / "model.onnx", models / "c" / "1" / "model.om", models / "d.om"):
        touch(model)
    counted = opens(models)
    planner = Planner(models, DEFAULTS, SettleGate(0.0, wall_clock=ahead), unload_missing=True, wall_clock=ahead)
    scans = await rescans(planner, counted, 3)
    assert {name: counted.of(path) for name, path in configs.items()} == {"a": 1, "b": 1, "c": 1, "d": 1}
    assert scans[0].problems == scans[1].problems == scans[2].problems  # its refusal kept, word for word
    assert sorted(scans[2].problems) == ["a", "b"] and "x_list: unknown key" in scans[2].problems["a"]
    assert scans[2].config_problems["b"][0] == str(configs["b"])  # (held back while it is being written)
    assert scans[0].notes == scans[2].notes  # what reading c's config said, said at each scan
    assert sorted(scans[2].models) == ["c", "d"] and scans[2].models["d"].config.instances == 2

    # an edit of the same size, its mtime set back (cp -p, tar): its ctime changed, it is read
    before = os.stat(configs["a"])
    configs["a"].write_text(BROKEN_YAML.replace("x_list", "y_list"))
    os.utime(configs["a"], ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(configs["a"]).st_size == before.st_size
    # a file of the same size and mtime renamed into place (another inode): read too
    mtime = os.stat(configs["d"]).st_mtime_ns
    write_in(configs["d"], "instances: 3\n")
    os.utime(configs["d"], ns=(mtime, mtime))
    found = (await rescans(planner, counted, 1))[0]
    assert {name: counted.of(path) for name, path in configs.items()} == {"a": 2, "b": 1, "c": 1, "d": 2}
    assert "y_list: unknown key" in found.problems["a"] and found.models["d"].config.instances == 3


@pytest.mark.asyncio
async def test_a_config_changed_just_now_is_parsed_at_each_scan_until_it_rests(models, opens):
    """A write within a timestamp's tick (a jiffy; a second or two on some filesystems) after the
    scan read the file would leave its identity as it was: a file that fresh is not kept."""
    config = touch(models / "a.yaml", "instances: 2\n")
    touch(models / "a.om")
    now = [os.stat(config).st_ctime]
    counted = opens(models)
    planner = Planner(models, DEFAULTS, SettleGate(0.0, wall_clock=ahead), unload_missing=True,
                      wall_clock=lambda: now[0])
    assert [found.models["a"].config.instances for found in await rescans(planner, counted, 2)] == [2, 2]
    assert counted.of(config) == 2
    now[0] += FRESH_S + 1
    await rescans(planner, counted, 2)
    assert counted.of(config) == 3


def test_the_reads_of_config_files_no_longer_read_are_forgotten(models, tmp_path):
    reads = ConfigReads(DEFAULTS, ahead)
    touch(models / "a.om")
    touch(models / "a.yaml", "instances: 2\n")
    touch(models / "b" / "1" / "model.om")
    touch(models / "b" / "config.pbtxt", "max_batch_size: 4\n")
    scan(models, DEFAULTS, reads)
    assert len(reads) == 2
    models.rename(tmp_path / "away")  # a folder that cannot be listed forgets nothing: it is back soon
    assert scan(models, DEFAULTS, reads).unreadable and len(reads) == 2
    (tmp_path / "away").rename(models)
    touch(models / "b" / "config.yaml", "instances: 2\n")  # read instead of the config.pbtxt
    (models / "a.yaml").unlink()
    scan(models, DEFAULTS, reads)
    assert len(reads) == 1
    with pytest.raises(ValueError, match="other defaults"):
        scan(models, ModelConfig(), reads)


def test_a_config_file_over_the_limit_is_refused_unread(models):
    """Valid YAML and text format both, over the limit by a little and by much: the size is the
    reason, from fstat, nothing parsed (the whole file was, at every scan)."""
    touch(models / "big.om")
    touch(models / "big.yaml", "instances: 2\n" + "# a comment\n" * 100_000)
    touch(models / "edge.om")
    touch(models / "edge.yaml", "instances: 2\n".ljust(MAX_CONFIG_BYTES + 1, " "))
    touch(models / "ok.om")
    touch(models / "ok.yaml", "instances: 2\n".ljust(MAX_CONFIG_BYTES, " "))
    touch(models / "t" / "1" / "model.om")
    touch(models / "t" / "config.pbtxt", "max_batch_size: 4\n" + "# a comment\n" * 30_000)
    result = scan(models, DEFAULTS)
    assert result.problems == {
        "big": f"{models}/big.yaml: 1.1 MiB, more than a config file may be (256 KiB)",
        "edge": f"{models}/edge.yaml: 262,145 bytes, more than a config file may be (262,144 bytes)",
        "t": f"{models}/t/config.pbtxt: 352 KiB, more than a config file may be (256 KiB)"}
    assert result.config_problems["big"][0] == str(models / "big.yaml")  # (held back while it is being written)
    assert result.models["ok"].config.instances == 2


def test_a_server_config_over_the_limit_is_refused_a_pipe_too(tmp_path):
    """A server config is read once, at the start, but may be a pipe (`--config <(...)`), read
    as far as the limit: one that never ended was read until memory ran out."""
    big = tmp_path / "big.yaml"
    big.write_text("port: 8080\n" + "# a comment\n" * 30_000)
    said = r": 352 KiB, more than a config file may be \(256 KiB\)$"
    with pytest.raises(ConfigError, match=f"^{re.escape(str(big))}{said}"):
        load_server_config(big)
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)

    def write_on() -> None:  # 768 KiB of comments, less once the reader has closed its end
        try:
            with open(fifo, "w") as f:
                for _ in range(64):
                    f.write("# a comment\n" * 1024)
        except BrokenPipeError:
            pass
    writer = threading.Thread(target=write_on, daemon=True)
    writer.start()
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(fifo))}: more than a config file may be \(256 KiB\)$"):
        load_server_config(fifo)
    writer.join(LIMIT_S)
    assert not writer.is_alive()


@pytest.mark.asyncio
async def test_a_served_model_beside_a_broken_config_scans_without_parsing_it_again(make_repo, models_dir,
                                                                                     model_files, opens):
    """The repository as it serves: each load call rescans the folder, the broken config beside
    is not parsed again; fixed, it is, and its model serves."""
    place(model_files[1]["om"], models_dir / "m.om")
    place(model_files[2]["om"], models_dir / "bigm.om")
    config = touch(models_dir / "bigm.yaml", BROKEN_YAML)
    repo, _ = await make_repo(model_control_mode="explicit", wall_clock=ahead)
    reason = next(row["reason"] for row in repo.index() if row["name"] == "bigm")
    assert "x_list: unknown key" in reason
    counted = opens(models_dir)
    for _ in range(2):
        await repo.load("m")  # (each reads the folder)
        counted.settle()
    assert counted.of(config.resolve()) == 0
    assert next(row["reason"] for row in repo.index() if row["name"] == "bigm") == reason
    write_in(config, "instances: 1\n")
    await repo.load("bigm")
    assert counted.of(config.resolve()) == 1
    assert {row["name"]: row["state"] for row in repo.index()} == {"m": State.READY, "bigm": State.READY}
