"""A version its policy does not select stays "not selected" while its model's config is being
edited: in the index, and a request pinned to it a 404 naming the policy (gRPC NOT_FOUND). While
an edit settled (settle_s) it was UNAVAILABLE "waiting for its config file to be complete", a 503
to retry, and 404 again after; while the config did not read (the versions it selected serving
on) its row went from the index and a request was told "has no version 1". Real server on a real
port, poll mode, real CPU OMs; settle_s is long, so an edit written in place settles for the
whole test (nothing is timed)."""
from __future__ import annotations

import os

import pytest

from tests.repository.repo_helpers import write_in
from tests.serving import wait_until

from .test_unloaded_then_unselected import NOT_SELECTED, assert_told_not_selected, index, serving, versions

WAITING = "waiting for its config file to be complete"
SETTLE_S = 600.0


@pytest.fixture
def three_versions(models_dir, tmp_path):
    """addk/1..3 of which its policy selects 3, written long ago: the start takes them at once."""
    folder = tmp_path / "models"
    versions(folder, models_dir / "double.om", 3, "{specific: [3]}")
    for path in [folder, *folder.rglob("*")]:
        os.utime(path, (100, 100))
    return folder


def test_a_version_left_out_stays_not_selected_while_a_policy_edit_settles(three_versions):
    config = three_versions / "addk" / "config.yaml"
    with serving(three_versions, "poll", settle_s=SETTLE_S) as srv:
        assert index(srv) == {"1": ("UNAVAILABLE", NOT_SELECTED), "2": ("UNAVAILABLE", NOT_SELECTED),
                              "3": ("READY", "")}
        config.write_text("version_policy: {specific: [2, 3]}\n")  # written in place: it settles
        wait_until(lambda: index(srv)["2"] == ("UNAVAILABLE", WAITING), "the edit seen (2 waits for it)")
        assert index(srv) == {"1": ("UNAVAILABLE", NOT_SELECTED), "2": ("UNAVAILABLE", WAITING),
                              "3": ("READY", "")}
        assert_told_not_selected(srv, "1")


@pytest.mark.parametrize("how", ["renamed in", "written in place"])
def test_the_old_selection_holds_while_the_config_does_not_read(three_versions, how):
    """Renamed in, the broken config is a problem at once; written in place, while it settles
    ("waiting for its config file": not logged yet). Either way 3 serves on, and 1 and 2 are
    what they were: not selected."""
    config = three_versions / "addk" / "config.yaml"
    with serving(three_versions, "poll", settle_s=SETTLE_S) as srv:
        broken = "version_policy: {specific: [2\n"
        if how == "renamed in":
            write_in(config, broken)
        else:
            config.write_text(broken)
        wait_until(lambda: "" in index(srv), "the broken config seen (a problem row)")
        rows = index(srv)
        problem = rows.pop("")
        assert (problem[1] == WAITING) == (how == "written in place"), problem
        assert rows == {"1": ("UNAVAILABLE", NOT_SELECTED), "2": ("UNAVAILABLE", NOT_SELECTED), "3": ("READY", "")}
        for version in "12":
            assert_told_not_selected(srv, version)
