"""The log says when readiness changes after the start's line: a server that started "not ready
yet" (its loads failing with a transient device error, retried) never said it became ready,
though /v2/health/ready turned 200 (an independent tester's find), and one whose readiness turned
off (strict: a load call that failed) said nothing either. One line a change, not one a probe:
the probes below ask several times. Nothing is timed: readiness is waited for (hang guards)."""
from __future__ import annotations

import logging
import os
import re
import shutil
import urllib.error
import urllib.request

import pytest

from aclserve.acl.cpu import faults
from aclserve.server.readiness_log import ReadinessLog

from tests.serving import ServerThread, request, server_config, wait_until

SAYS_READINESS = ("aclserve ready", "aclserve started", "aclserve not ready")  # (the start's line among them)


def _ready(url: str) -> bool:
    try:
        return urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=30).status == 200
    except urllib.error.HTTPError as e:
        e.close()
        return False


def _said(caplog) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage().split(":")[0]) for r in caplog.records
            if r.name.startswith("aclserve.server") and r.getMessage().startswith(SAYS_READINESS)]


def test_a_server_that_started_not_ready_says_once_that_it_is_ready(double_dir, caplog, clean_faults):
    caplog.set_level(logging.INFO, logger="aclserve")
    faults.inject("load", code=207001, count=1)  # the start's load fails; its retry, a second later, loads
    with ServerThread(server_config(double_dir, model_control_mode="none")) as srv:
        # said without a probe asking (the check once a second), then not again at each probe
        wait_until(lambda: ("INFO", "aclserve ready now") in _said(caplog), "said ready")
        assert all(_ready(srv.url) for _ in range(3))
        said = _said(caplog)
    assert said == [("INFO", "aclserve started; not ready yet"), ("INFO", "aclserve ready now")], said


def test_readiness_turned_off_and_on_again_is_said_once_each(double_dir, models_dir, caplog, clean_faults):
    caplog.set_level(logging.INFO, logger="aclserve")
    with ServerThread(server_config(double_dir)) as srv:  # explicit: a load call names what should serve
        assert _ready(srv.url)
        shutil.copy(models_dir / "affine.om", double_dir / "affine.om")
        faults.inject("load", code=100000, count=1)  # refused for good: strict readiness waits for it
        status, _, answer = request(srv, "POST", "/v2/repository/models/affine/load")
        assert status == 400, answer
        assert not any(_ready(srv.url) for _ in range(3))
        status, _, answer = request(srv, "POST", "/v2/repository/models/affine/load")
        assert status == 200, answer
        wait_until(lambda: _ready(srv.url), "ready again")
        assert all(_ready(srv.url) for _ in range(3))
        said = _said(caplog)
    assert said == [("INFO", "aclserve ready"), ("WARNING", "aclserve not ready now (readiness probes answer 503)"),
                    ("INFO", "aclserve ready now")], said


def test_lenient_readiness_says_what_its_ready_means(double_dir, caplog, clean_faults):
    """With `readiness: lenient` the line said "every model that should serve does" while a
    model had failed to load (a tester, t84): it says lenient's rule instead."""
    caplog.set_level(logging.INFO, logger="aclserve")
    faults.inject("load", code=207001, count=1)  # the start's load fails; its retry, a second later, loads
    with ServerThread(server_config(double_dir, model_control_mode="none", readiness="lenient")):
        wait_until(lambda: ("INFO", "aclserve ready now") in _said(caplog), "said ready")
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("aclserve ready now")]
    assert said == ["aclserve ready now: every model serves or has failed to load, and one at least serves "
                    "(readiness: lenient; a model that failed: POST /v2/repository/index)"], said


def test_the_not_ready_lines_name_the_models_waiting_for_room(double_dir, caplog):
    """A strict server of more models than its device holds stays unready (as documented), and its
    lines named nothing but the index (a tester, t95: 144 of 200 models past the device's streams
    and events): they say how many models do not serve, why, and the first ones. At the start; and
    when a model copied in later turns readiness off (its line said while it loads, said again
    once it is refused). The device allows 15 streams: its own 3 and three models' 4 each."""
    caplog.set_level(logging.INFO, logger="aclserve")
    for name in ("m2", "m3", "m4"):
        shutil.copy(double_dir / "double.om", double_dir / f"{name}.om")
    for path in double_dir.iterdir():
        os.utime(path, (1, 1))  # (old: loaded at the start, not settling)
    config = server_config(double_dir, model_control_mode="poll", settle_s=0.1, debounce_s=0.05,
                           **{"device_limits.streams": 15})
    waits = re.compile(r"1 model not serving: device 0 short of streams or events \((\w+)\); see POST "
                       r"/v2/repository/index for each model's state$")

    def said(start: str) -> list[str]:
        return [r.getMessage()[len(start):] for r in caplog.records if r.getMessage().startswith(start)]
    with ServerThread(config) as srv:
        (started,) = said("aclserve started; not ready yet: ")
        waiting = waits.match(started)
        assert waiting, started
        (double_dir / f"{waiting[1]}.om").unlink()  # (not loaded: the three others serve, ready)
        wait_until(lambda: _ready(srv.url), "ready once the model past the device is gone", guard_s=60)
        shutil.copy(double_dir / "double.om", double_dir / "m5.om")
        wait_until(lambda: any(waits.match(line) and "(m5)" in line
                               for line in said("aclserve not ready now (readiness probes answer 503): ")
                               + said("aclserve still not ready (readiness probes answer 503): ")),
                   "a not-ready line naming m5", guard_s=60)
        assert not _ready(srv.url)


@pytest.mark.asyncio
async def test_a_not_ready_line_said_while_models_load_is_said_again_once_they_are_done(caplog):
    """Readiness turns off as soon as a model is copied in, before its load ends: that line can say only
    `loading`. Once nothing loads or waits to load, what holds readiness back is said once more (the
    repository's not_serving and readiness as ServerState gives them; the server test above may see
    either line, as its check comes before or after the load's refusal)."""
    caplog.set_level(logging.INFO, logger="aclserve")
    now = {"why": ("1 model not serving: loading (m5)", False)}
    lines = ReadinessLog(lambda: False, "strict", lambda: now["why"])
    lines.started(True)
    lines.seen(False)
    lines.seen(False)  # (still loading: nothing more to say)
    now["why"] = ("1 model not serving: device 0 short of streams or events (m5)", True)
    lines.seen(False)
    lines.seen(False)  # (said: not again)
    lines.close()
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "aclserve.server.readiness_log"]
    hint = "see POST /v2/repository/index for each model's state"
    assert said == [("INFO", "aclserve ready: models loaded"),
                    ("WARNING", f"aclserve not ready now (readiness probes answer 503): 1 model not serving: loading "
                                f"(m5); {hint}"),
                    ("WARNING", "aclserve still not ready (readiness probes answer 503): 1 model not serving: device 0 "
                                f"short of streams or events (m5); {hint}")], said
