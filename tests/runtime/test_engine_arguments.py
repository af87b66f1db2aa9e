"""The Engine's arguments, checked where they are given (found by an independent check of the
Python API): Engine(), load() and infer()'s timeout, the counts the server takes (and no more),
ACLSERVE_CPU_THREADS unless cpu_threads is given, numpy integers taken as ints."""
from __future__ import annotations

import numpy as np
import pytest

from aclserve.runtime import Engine

from tests.tiny_models import affine_request

pytestmark = pytest.mark.usefixtures("clean_faults")


@pytest.mark.parametrize("timeout, error, words", [
    ("1", TypeError, "timeout must be a number of seconds or None, got '1'"),
    (True, TypeError, "timeout must be a number of seconds or None"),
    (-1, ValueError, "timeout must be a number of seconds from 0 to [0-9]+, or None, got -1"),
    (float("nan"), ValueError, "got nan"),
    (float("inf"), ValueError, "got inf"),
    (1e300, ValueError, "got 1e.300"),  # (finite, but past what threading's waits take: OverflowError)
])
def test_a_bad_infer_timeout_is_named(affine_om, timeout, error, words):
    """timeout="1" failed in threading ("'<' not supported between instances of 'str' and
    'int'") after the call had been submitted."""
    with Engine(device="cpu") as engine:
        model = engine.load(affine_om(), warmup=False)
        with pytest.raises(error, match=words):
            model.infer(affine_request(1), timeout=timeout)
        assert model.infer(affine_request(1), timeout=30)["y"].shape == (1, 4)


@pytest.mark.parametrize("where, kwargs, error, words", [
    ("engine", {"device": 0}, ValueError, "device must be one of auto, cpu, npu"),
    ("engine", {"cpu_threads": "2"}, TypeError, "cpu_threads must be an int"),
    ("engine", {"memory_reserve_fraction": 1.5}, ValueError, "memory_reserve_fraction must be at least 0"),
    ("engine", {"cpu_threads": np.int64(0)}, ValueError, "cpu_threads must be from 1"),
    ("load", {"slots": 1.5}, TypeError, "slots must be an int"),
    ("load", {"instances": 0}, ValueError, "instances must be from 1"),
    ("load", {"devices": "0"}, TypeError, "devices must be a non-empty list or tuple"),
    ("load", {"devices": [0, -1]}, ValueError, r"^devices entry must be at least 0, got -1$"),
    # as the server's config refuses them: (1, 1, 0) put two of three instances on device 1
    ("load", {"devices": (0, 0)}, ValueError, r"^devices has duplicates: \[0, 0\] names device 0 more than once; "
                                              r"list each device once \(each instance goes on the one of them "
                                              r"holding the fewest instances\)$"),
    ("load", {"devices": [np.int64(1), 1, 0, 2, 2]}, ValueError,
     r"^devices has duplicates: \[1, 1, 0, 2, 2\] names devices 1, 2 more than once"),
    ("load", {"path": b"m.om"}, TypeError, "path must be a str or os.PathLike"),
    ("load", {"warmup": "no"}, TypeError, "warmup must be True or False, got 'no'"),
    ("load", {"warmup": 2}, TypeError, "warmup must be True or False, got 2"),
    ("load", {"warmup_data": "random"}, ValueError, "warmup_data must be one of zeros, ones, got 'random'"),
    ("load", {"retry": None}, TypeError, "retry must be True or False, got None"),
])
def test_arguments_are_checked_where_they_are_given(affine_om, where, kwargs, error, words):
    """slots=1.5 failed with "can't multiply sequence by non-int" after claiming device memory."""
    if where == "engine":
        with pytest.raises(error, match=words):
            Engine(**kwargs)
        return
    with Engine(device="cpu") as engine:
        with pytest.raises(error, match=words):
            engine.load(**{"path": affine_om(), **kwargs})
        assert engine.models == []


def test_the_engine_takes_the_counts_the_server_takes_and_refuses_past_them_alike(affine_om, tmp_path):
    """Engine.load(slots=2000) was refused ("slots must be from 1 to 1024"): one bound of its own for
    instances, slots and threads, said to be the server's, where the server takes up to 10,921 slots (a
    tester). Each bound is now one constant both read: a count the server takes passes the Engine's
    check (slots past the device's events are then refused by the load, as the server's load does),
    one past it is refused by both."""
    from aclserve.acl.cpu import settings
    from aclserve.config.model import parse_model_config
    from aclserve.errors import LoadError
    from aclserve.runtime.acl_runtime import MAX_CPU_THREADS as MAX_THREADS
    from aclserve.runtime.limits import MAX_INSTANCES, MAX_SLOTS
    from tests.serving import server_config

    assert MAX_SLOTS == 10921
    for key, most in (("slots", MAX_SLOTS), ("instances", MAX_INSTANCES)):
        assert getattr(parse_model_config({key: most}), key) == most
        with pytest.raises(ValueError, match=rf"{key}: must be <= {most}, got {most + 1}"):
            parse_model_config({key: most + 1})
    assert server_config(tmp_path, cpu_threads=MAX_THREADS).cpu_threads == MAX_THREADS == settings.MAX_THREADS
    with pytest.raises(ValueError, match=rf"cpu_threads: must be <= {MAX_THREADS}, got {MAX_THREADS + 1}"):
        server_config(tmp_path, cpu_threads=MAX_THREADS + 1)
    with pytest.raises(ValueError, match=rf"^cpu_threads must be from 1 to {MAX_THREADS}, got {MAX_THREADS + 1}$"):
        Engine(device="cpu", cpu_threads=MAX_THREADS + 1)
    with Engine(device="cpu") as engine:
        for slots in (2000, MAX_SLOTS):  # (the CPU runtime presents 1,023 events: the load refuses them)
            with pytest.raises(LoadError, match=rf"x {slots} slots\) needs 4 streams and {6 * slots + 6} events"):
                engine.load(affine_om(), slots=slots, warmup=False)
        with pytest.raises(ValueError, match=rf"^slots must be from 1 to {MAX_SLOTS}, got {MAX_SLOTS + 1}$"):
            engine.load(affine_om(), slots=MAX_SLOTS + 1)
        past = MAX_INSTANCES + 1
        with pytest.raises(ValueError, match=rf"^instances must be from 1 to {MAX_INSTANCES}, got {past}$"):
            engine.load(affine_om(), instances=past)
        assert engine.models == []


def test_engine_threads_follow_the_environment_unless_given(monkeypatch, affine_om):
    """Engine's cpu_threads=1 default overrode ACLSERVE_CPU_THREADS, which the README gives the
    Python API."""
    from aclserve.acl.cpu import settings
    monkeypatch.setenv("ACLSERVE_CPU_THREADS", "3")
    with Engine(device="cpu"):
        assert settings.threads() == 3
    with Engine(device="cpu", cpu_threads=2):
        assert settings.threads() == 2


def test_a_bad_thread_count_in_the_environment_is_named_at_start(monkeypatch, affine_om):
    """It was read at the first load, whose error said the model was not a loadable OM file
    (found by an independent check); `aclserve serve` checked it at its start already."""
    monkeypatch.setenv("ACLSERVE_CPU_THREADS", "abc")
    engine = Engine(device="cpu")
    with pytest.raises(ValueError, match="ACLSERVE_CPU_THREADS must be an integer from 1 to 1024, got 'abc'"):
        engine.load(affine_om())
    monkeypatch.setenv("ACLSERVE_CPU_THREADS", "2")  # put right: the same engine starts
    with engine:
        assert engine.load(affine_om()).infer(affine_request(1))


def test_numpy_integers_are_taken_as_arguments(affine_om):
    """cpu_threads=np.int64(2) passed the argument check, then failed at start naming no argument."""
    with Engine(device="cpu", cpu_threads=np.int64(2)) as engine:
        model = engine.load(affine_om(), instances=np.int64(1), slots=np.int64(2), devices=[np.int64(0)])
        assert model.infer(affine_request(1), timeout=30)["s"].shape == (1, 3)
