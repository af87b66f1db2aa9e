"""Reasons the repository gives in its log and index, in words that say what happened (found by
an independent tester's reading of them); real files, the real repository on the CPU runtime."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import aiohttp
import pytest

from aclserve.errors import InvalidInput
from aclserve.repository.repository import ModelLoadFailed

from tests.serving import server_config, started_app
from tests.tiny_models import tiny_cpu_om_bytes

from .repo_helpers import place

pytestmark = pytest.mark.asyncio


def cpu_om_start(model_files) -> bytes:
    """A CPU OM cut short: the first 100 bytes of one (a copy that died on the way, say)."""
    return Path(model_files[1]["om"]).read_bytes()[:100]


@pytest.mark.parametrize("content, said", [
    (b"", "not a loadable OM: the file is empty (0 bytes)"),
    (b"x" * 12, "not a loadable OM: the file is too short to be an OM (12 bytes)"),
    (cpu_om_start, "not a loadable OM: the file is too short to be an OM (100 bytes)"),
    (lambda _: tiny_cpu_om_bytes(), "not a loadable OM: the file is too short to be an OM (197 bytes)"),
], ids=["empty", "12 bytes", "a CPU OM cut short", "a whole CPU OM of 197 bytes"])
async def test_a_file_too_short_to_be_an_om_is_said_so_once(make_repo, models_dir, model_files, caplog, content,
                                                            said):
    """It was "not an OM file (neither a CPU OM nor an ATC 'IMOD' header)": true, but such a file
    has no header to be either (i212); then "not an OM file: the file is ...", where an Engine's
    load of the file said "not a loadable OM: not an OM file: the file is ..." (i221): one reason now,
    in the index, the load's error and the log, in the words of the Engine's (runtime/test_unread_file.py).
    A CPU OM's start was "CPU OM length mismatch: header says N bytes, file has 100 (truncated?)",
    and a whole CPU OM under 256 bytes passed the check to be refused by the runtime for its size,
    "is a CPU OM, built for aclserve's CPU runtime, and was refused: on an Ascend host rebuild it ..." (i232)."""
    repo, _ = await make_repo(model_control_mode="explicit")
    (models_dir / "m.om").write_bytes(content(model_files) if callable(content) else content)
    with caplog.at_level(logging.WARNING, logger="aclserve.repository"), pytest.raises(ModelLoadFailed) as refused:
        await repo.load("m")
    assert str(refused.value) == f"failed to load m: version 1: {said}"
    assert [(r["name"], r["reason"]) for r in repo.index()] == [("m", said)]
    assert f"{models_dir / 'm.om'} not loaded: {said}" in caplog.text, caplog.text


async def test_a_cpu_om_too_short_is_said_so_by_the_load_call_and_the_index_over_http(models_dir):
    """The reason of the test above as a client reads it: the load call's 400 and the index's row."""
    (models_dir / "m.om").write_bytes(tiny_cpu_om_bytes())
    os.utime(models_dir / "m.om", (1, 1))  # an old file: taken at once
    said = "not a loadable OM: the file is too short to be an OM (197 bytes)"
    runner, _, url, _, _ = await started_app(server_config(models_dir))
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v2/repository/models/m/load") as resp:
                load = (resp.status, await resp.json())
            async with session.post(f"{url}/v2/repository/index", json={}) as resp:
                index = [(row["name"], row.get("reason")) for row in await resp.json()]
    finally:
        await runner.cleanup()
    assert load == (400, {"error": f"failed to load m: version 1: {said}"}), load
    assert index == [("m", said)], index


async def test_a_reload_after_the_config_is_deleted_says_so(make_repo, models_dir, model_files, caplog):
    """Deleting m.yaml reloads m with the server's model_defaults; the log said "reloaded (its new
    config)", as for an edit of it: now it says the config was removed and what serves now."""
    place(model_files[1]["om"], models_dir / "m.om")
    (models_dir / "m.yaml").write_text("batching: {max_queue_delay_ms: 2}\n")
    repo, events = await make_repo()
    assert repo.get("m").config.batching.max_queue_delay_ms == 2
    with caplog.at_level(logging.INFO, logger="aclserve.repository"):
        os.unlink(models_dir / "m.yaml")
        await events.wait("reloaded", "m", "1")
    assert repo.get("m").config.batching.max_queue_delay_ms == 0.5  # make_repo's model_defaults
    assert ("m: version 1 reloaded (its config m.yaml removed: it serves with the server's model_defaults now), "
            "the one before drains") in caplog.text


async def test_a_reload_reading_another_config_beside_the_old_one_says_it_was_set_aside(make_repo, models_dir,
                                                                                        model_files, caplog):
    """m.yaml added beside m.yml is read instead: the log said m.yml was "removed" (reviewer r21)."""
    place(model_files[1]["om"], models_dir / "m.om")
    (models_dir / "m.yml").write_text("batching: {max_queue_delay_ms: 2}\n")
    repo, events = await make_repo()
    with caplog.at_level(logging.INFO, logger="aclserve.repository"):
        (models_dir / "m.yaml").write_text("batching: {max_queue_delay_ms: 3}\n")
        await events.wait("reloaded", "m", "1")
    assert repo.get("m").config.batching.max_queue_delay_ms == 3
    assert "m: version 1 reloaded (its config m.yml set aside: it serves with m.yaml's settings now)" in caplog.text


async def test_a_reload_from_a_models_link_switched_to_another_folder_names_both_configs(make_repo, models_dir,
                                                                                        model_files, caplog):
    """`models -> gen1` switched to `models -> gen2`, each with its m.yaml: the log said "its config
    m.yaml set aside: it serves with m.yaml's settings now" (a tester, t82); now it names their folders."""
    for gen, scale in (("gen1", 1), ("gen2", 2)):
        place(model_files[scale]["om"], models_dir / gen / "m.om")
        (models_dir / gen / "m.yaml").write_text(f"batching: {{max_queue_delay_ms: {scale}}}\n")
    os.symlink("gen1", models_dir / "current")
    repo, events = await make_repo(models_dir=str(models_dir / "current"))
    with caplog.at_level(logging.INFO, logger="aclserve.repository"):
        os.symlink("gen2", models_dir / "current.new")
        os.replace(models_dir / "current.new", models_dir / "current")
        await events.wait("reloaded", "m", "1")
    assert repo.get("m").config.batching.max_queue_delay_ms == 2
    assert ("m: version 1 reloaded (its new file; its config gen1/m.yaml set aside: it serves with gen2/m.yaml's "
            "settings now), the one before drains") in caplog.text


@pytest.mark.parametrize("name, reason", [
    ("x\0y", "model names may not contain a NUL character (\\x00)"),
    ("x/y", "model names may not contain path separators ('/', '\\')"),
    ("..", "model names may not be empty, '.' or '..'")])
async def test_a_load_of_a_name_no_model_has_names_what_is_wrong(make_repo, name, reason):
    """A name with a NUL was refused for "path separators", which a NUL is not (a load of
    x%00y through the API): the character is named."""
    repo, _ = await make_repo(model_control_mode="explicit")
    with pytest.raises(InvalidInput) as refused:
        await repo.load(name)
    assert refused.value.message == f"invalid model name {name!r}: {reason}"
