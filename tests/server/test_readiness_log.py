"""The log says when readiness changes after the start's line: a server that started "not ready
yet" (its loads failing with a transient device error, retried) never said it became ready,
though /v2/health/ready turned 200 (an independent tester's find), and one whose readiness turned
off (strict: a load call that failed) said nothing either. One line a change, not one a probe:
the probes below ask several times. Nothing is timed: readiness is waited for (hang guards)."""
from __future__ import annotations

import logging
import shutil
import urllib.error
import urllib.request

from aclserve.acl.cpu import faults

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
