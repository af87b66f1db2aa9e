"""The cycle collector's setting for `aclserve serve` (collector.py)."""
import gc

import pytest

from aclserve import collector


@pytest.fixture
def threshold():
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


def test_default_young_threshold_raised_others_kept(threshold):
    gc.set_threshold(700, 10, 10)
    collector.tune_for_server()
    assert gc.get_threshold() == (collector.YOUNG_THRESHOLD, 10, 10)


def test_higher_setting_wins(threshold):
    gc.set_threshold(50_000, 20, 5)
    collector.tune_for_server()
    assert gc.get_threshold() == (50_000, 20, 5)


def test_collector_switched_off_stays_off(threshold):
    gc.set_threshold(0, 10, 10)
    collector.tune_for_server()
    assert gc.get_threshold()[0] == 0
