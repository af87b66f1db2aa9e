"""/metrics' text is written by server/exposition.py from plain rows, no longer by
prometheus_client's generate_latest (a scrape of 41 versions cost ~115 ms of CPU through
prometheus_client, ~18 ms of it on the event loop; tester t30 saw one-row requests' p99 go from
4.7 to 24 ms with a scrape a second). Both must write the same bytes: a real server's scrape
(several models, histograms with observations, a model's load failure whose reason holds a
quote, a backslash and a newline), and families made up to hold every case of the format (label
values and HELP text needing escapes, label names either side of `le`, numbers Go writes with an
exponent, NaN and infinities)."""
from __future__ import annotations

import asyncio
import json
import shutil

import aiohttp
from prometheus_client import generate_latest

from aclserve.server.exposition import Family, render
from aclserve.server.scrape import Snapshot
from tests.serving import server_config, started_app

from .test_server_metrics import BODY

# a config key of a quote, a backslash and a newline: the model's load-failure reason quotes it (its
# newline written \n: config/checks.py), so the label holds quotes and backslashes to escape
ODD_KEY = 'q"b\\s\nn'


def _models(tmp_path, models_dir):
    own = tmp_path / "models"
    own.mkdir()
    for name in ("affine", "double"):
        shutil.copy(models_dir / f"{name}.om", own / f"{name}.om")
    (own / "odd" / "1").mkdir(parents=True)
    shutil.copy(models_dir / "double.om", own / "odd" / "1" / "model.om")
    (own / "odd" / "config.yaml").write_text(json.dumps({ODD_KEY: 1}) + "\n")  # (JSON is YAML)
    (own / "garbage" / "1").mkdir(parents=True)
    (own / "garbage" / "1" / "model.om").write_bytes(b"not a model\n" * 100)  # a version's load failure
    return own


def test_a_servers_scrape_is_the_text_generate_latest_writes(tmp_path, models_dir):
    async def scrape():
        config = server_config(_models(tmp_path, models_dir), model_control_mode="none")
        runner, state, url, *_ = await started_app(config)
        try:
            async with aiohttp.ClientSession() as session:
                for _ in range(3):
                    async with session.post(f"{url}/v2/models/affine/infer", json=BODY) as resp:
                        assert resp.status == 200
                wrong = dict(BODY, inputs=BODY["inputs"][:1])
                async with session.post(f"{url}/v2/models/affine/infer", json=wrong) as resp:
                    assert resp.status == 400
                async with session.get(f"{url}/metrics") as resp:
                    served = await resp.read()
            return state.metrics.snapshot(), served
        finally:
            await runner.cleanup()

    snapshot, served = asyncio.run(scrape())
    text = render(snapshot.families)
    assert text == generate_latest(snapshot)
    # what the comparison stands on: observations, failures and a reason needing every escape
    assert b'aclserve_request_duration_seconds_count{model="affine",version="1"} 3.0\n' in text
    assert b'aclserve_request_failure_total{model="affine",reason="InvalidInput",version="1"} 1.0\n' in text
    assert b"'q\\\"b\\\\\\\\s\\\\nn'" in text and b'model="garbage"' in text
    assert served.count(b"\n") == text.count(b"\n")  # (the route writes it: the same lines, taken earlier)


ODD_LABELS = ["", "plain", 'a "quote"', "back\\slash", "new\nline", '\\"\n\\n', "ünïcödé", "{0}", "}{", "le"]
NUMBERS = [0, 1, 999_999, 1_000_000, 12_345_678, 10 ** 20, -3, True, 0.0, -0.0, 0.5, 1e-7, 999_999.9,
           1e6, 1_234_567.5, 1e22, -2.5, float("inf"), float("-inf"), float("nan")]
BOUNDS = (0.0002, 0.5, 1.0, 2.5, 1e6, 1_234_567.0)


def _made_up_families() -> list[Family]:
    help_text = 'a help text with a back\\slash,\na newline and "quotes"'
    plain = Family("counter", "t_plain", help_text)
    for n in NUMBERS:
        plain.add((), n)
    gauge = Family("gauge", "t_gauge", "", ["zeta", "alpha", "model"])  # (written in name order)
    for i, n in enumerate(NUMBERS):
        gauge.add((ODD_LABELS[i % len(ODD_LABELS)], ODD_LABELS[-1 - i % len(ODD_LABELS)], str(i)), n)
    both_sides = Family("histogram", "t_seconds", help_text, ["z", "a"], BOUNDS)  # `le` between them
    for i, label in enumerate(ODD_LABELS):
        counts = [0] * (len(BOUNDS) + 1) if i == 0 else [i, 0, 3 * i, 0, 400_000 * i, i, 7]
        total_sum = [0.0, 1e7, 3.25, float("nan"), 1_234_567.5][i % 5]
        both_sides.rows.append(((label, ODD_LABELS[-1 - i]), counts, total_sum))
    unlabelled = Family("histogram", "t_rows", "rows", (), (1, 2, 4))
    unlabelled.rows.append(((), [1, 2, 0, 5], 9.0))
    return [plain, gauge, both_sides, unlabelled, Family("gauge", "t_empty", "no series", ["model"])]


def test_every_case_of_the_format_is_written_as_generate_latest_writes_it():
    families = _made_up_families()
    assert render(families) == generate_latest(Snapshot(families))


def test_a_scrape_says_the_text_format_it_is_written_in(tmp_path, models_dir):
    """/metrics is text format 0.0.4 (exposition.py writes it), and says so: its Content-Type was
    prometheus_client's newest, "version=1.0.0" with 0.26, whatever the text was (reviewer r16)."""
    async def scrape():
        own = tmp_path / "models"
        own.mkdir()
        shutil.copy(models_dir / "double.om", own / "double.om")
        runner, _, url, *_ = await started_app(server_config(own, model_control_mode="none"))
        try:
            async with aiohttp.ClientSession(auto_decompress=False) as session:
                answers = []
                for coding in ("identity", "gzip"):
                    async with session.get(f"{url}/metrics", headers={"Accept-Encoding": coding}) as resp:
                        answers.append((resp.status, resp.headers["Content-Type"]))
                return answers
        finally:
            await runner.cleanup()

    for status, content_type in asyncio.run(scrape()):
        assert status == 200 and content_type == "text/plain; version=0.0.4; charset=utf-8", (status, content_type)
