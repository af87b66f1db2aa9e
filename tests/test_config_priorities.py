"""Priority levels in the config: each level's queue policy inherits default_queue_policy; what
model_defaults gives past a model's own priority_levels (levels, default_priority) is left out,
said in a note; preserve_ordering takes one level, and is refused beside what Triton refuses with it."""
from __future__ import annotations

import re

import pytest

from aclserve.config import ConfigError, ModelConfig, load_model_config, load_server_config
from aclserve.scheduling.policy import QueuePolicy
from tests.config_files import write


def test_priority_levels_inherit_from_default_queue_policy():
    config = load_server_config(None, {"model_defaults.batching": {
        "default_queue_policy": {"default_timeout_ms": 100, "timeout_action": "delay"},
        "priority_queue_policy": {1: {"max_queue_size": 7}, "3": {"timeout_action": "reject"}}}})
    batching = config.model_defaults.batching
    assert batching.policy_for(1).max_queue_size == 7
    assert batching.policy_for(1).default_timeout_ms == 100 and batching.policy_for(1).timeout_action == "delay"
    assert batching.policy_for(3).timeout_action == "reject" and batching.policy_for(3).default_timeout_ms == 100
    assert batching.policy_for(2).max_queue_size is None  # auto: the default, resolved at load


def test_a_models_default_queue_policy_reaches_the_levels_model_defaults_gives(tmp_path):
    """A level's unset fields come from the default_queue_policy of all layers merged: a model's
    own default timeout reached its levels but not those of model_defaults, whose unset fields
    were fixed at the server's (an operator's audit). What a level sets stays its own."""
    defaults = load_server_config(None, {"model_defaults.batching.priority_queue_policy": {
        2: {"max_queue_size": 100}, 3: {"default_timeout_ms": 7}}}).model_defaults
    path = write(tmp_path, "batching: {max_batch_size: 1, default_queue_policy: "
                           "{default_timeout_ms: 100, timeout_action: delay}}\n", "m.yaml")
    batching = load_model_config(path, defaults).batching
    assert batching.policy_for(2) == QueuePolicy(max_queue_size=100, default_timeout_ms=100, timeout_action="delay")
    assert batching.policy_for(3) == QueuePolicy(max_queue_size=None, default_timeout_ms=7, timeout_action="delay")
    assert batching.policy_for(1) == batching.default_queue_policy
    # a level both give merges field by field ('2', quoted, is level 2 too: it was "given twice")
    path = write(tmp_path, "batching:\n  priority_queue_policy: {'2': {allow_timeout_override: false}}\n", "m.yaml")
    assert load_model_config(path, defaults).batching.policy_for(2) == QueuePolicy(
        max_queue_size=100, default_timeout_ms=None, allow_timeout_override=False)


def test_levels_only_model_defaults_gives_past_a_models_priority_levels_are_left_out(tmp_path):
    """`priority_levels: 1` in a model's file was refused with "batching.priority_queue_policy.2:
    must be <= 1", a key not in that file: model_defaults' level 2 has no queue in that model. It
    is left out, said in a note; a level the file gives itself past its levels is still refused."""
    defaults = load_server_config(None, {"model_defaults.batching.priority_queue_policy": {
        1: {"max_queue_size": 5}, 2: {"max_queue_size": 100}, 3: {"max_queue_size": 9}}}).model_defaults
    notes: list[str] = []
    batching = load_model_config(write(tmp_path, "batching: {priority_levels: 1}\n", "m.yaml"), defaults,
                                 notes).batching
    assert batching.priority_levels == 1 and batching.priority_queue_policy == {
        1: QueuePolicy(max_queue_size=5, default_timeout_ms=None)}
    assert notes == ["model_defaults' batching.priority_queue_policy levels 2, 3 left out: "
                     "the model has 1 priority level"]
    notes.clear()
    assert load_model_config(write(tmp_path, "instances: 2\n", "m.yaml"), defaults, notes).batching == \
        defaults.batching and notes == []
    past_levels = "batching.priority_queue_policy.2: names a level past priority_levels (1)"
    with pytest.raises(ConfigError, match=re.escape(past_levels)):
        load_model_config(write(tmp_path, "batching: {priority_levels: 1, priority_queue_policy: "
                                          "{2: {max_queue_size: 1}}}\n", "m.yaml"), defaults)


@pytest.mark.parametrize("levels, level", [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3)])
def test_fewer_priority_levels_alone_take_the_middle_one_as_default(tmp_path, levels, level):
    """A model's `priority_levels: 1` was refused for the embedded default's default_priority 2,
    which it never set; the default is now the middle level of the model's own."""
    defaults = load_server_config(None, {}).model_defaults
    batching = load_model_config(write(tmp_path, f"batching: {{priority_levels: {levels}}}\n"), defaults).batching
    assert batching.default_level == level and batching.level_for(None) == level
    assert load_server_config(None, {"model_defaults.batching.priority_levels": levels}
                              ).model_defaults.batching.default_level == level


def test_priorities_off_is_no_yaml_key(tmp_path):
    """A config.pbtxt's priority_levels 0 is carried as priorities_off (config/triton_config.py, for
    /config); aclserve's own YAML writes one level as `priority_levels: 1` and has no such key."""
    defaults = load_server_config(None, {}).model_defaults
    with pytest.raises(ConfigError, match="priorities_off"):
        load_model_config(write(tmp_path, "batching: {priorities_off: true}\n"), defaults)
    assert not load_model_config(write(tmp_path, "batching: {priority_levels: 1}\n"), defaults).batching.priorities_off


def test_a_default_priority_set_is_kept_through_a_merge(tmp_path):
    defaults = load_server_config(None, {"model_defaults.batching.default_priority": 3}).model_defaults
    assert defaults.batching.default_level == 3
    assert load_model_config(write(tmp_path, "instances: 2\n"), defaults).batching.default_level == 3
    # past a model's own priority_levels it goes back to auto, said in a note (it was refused:
    # "batching.default_priority: must be <= 1", a key the model's file did not hold)
    notes = []
    one = load_model_config(write(tmp_path, "batching: {priority_levels: 1}\n"), defaults, notes)
    assert one.batching.default_level == 1
    assert notes == ["model_defaults' batching.default_priority 3 is auto (its middle level) for it: "
                     "the model has 1 priority level"]
    two = load_model_config(write(tmp_path, "batching: {priority_levels: 2}\n"), defaults)
    assert two.batching.default_priority is None  # auto (its middle level)
    # the file's own: refused
    with pytest.raises(ConfigError, match="batching.default_priority: must be <= priority_levels \\(1\\)"):
        load_model_config(write(tmp_path, "batching: {priority_levels: 1, default_priority: 3}\n"), defaults)


def test_preserve_ordering_alone_takes_one_priority_level(tmp_path):
    """`preserve_ordering: true` alone in a model's file kept the default's three levels: answers
    were held for every earlier arrival, so a priority-1 request sent after 120 of level 3 was
    answered 121st, and /config showed a pair Triton refuses (an independent check). The model
    has one level, said in a note, and what model_defaults gives for the others is left out."""
    defaults = load_server_config(None, {"model_defaults.batching": {
        "priority_levels": 4, "default_priority": 3,
        "priority_queue_policy": {1: {"max_queue_size": 5}, 3: {"max_queue_size": 9}}}}).model_defaults
    notes: list[str] = []
    batching = load_model_config(write(tmp_path, "batching: {preserve_ordering: true}\n", "m.yaml"), defaults,
                                 notes).batching
    assert (batching.priority_levels, batching.preserve_ordering, batching.default_level) == (1, True, 1)
    assert batching.priority_queue_policy == {1: QueuePolicy(max_queue_size=5, default_timeout_ms=None)}
    assert notes == ["batching.preserve_ordering takes one priority level, not model_defaults' priority_levels 4 "
                     "(answers in arrival order let no level pass another); model_defaults' "
                     "batching.priority_queue_policy level 3 left out; model_defaults' batching.default_priority 3 "
                     "is auto (its middle level) for it: the model has 1 priority level"]
    notes.clear()
    assert load_model_config(write(tmp_path, "batching: {preserve_ordering: true, priority_levels: 1}\n", "m.yaml"),
                             ModelConfig(), notes).batching.priority_levels == 1 and notes == []


@pytest.mark.parametrize("server, model, path, said", [
    ({}, "batching: {preserve_ordering: true, priority_levels: 2}", "batching.preserve_ordering",
     "takes one priority level, not 2 (batching.priority_levels): answers in arrival order let no level pass "
     "another (Triton refuses the pair too); set priority_levels: 1, or preserve_ordering: false"),
    # model_defaults' preserve_ordering beside the model's own levels
    ({"model_defaults.batching": {"preserve_ordering": True, "priority_levels": 1}}, "batching: {priority_levels: 3}",
     "batching.preserve_ordering", "takes one priority level, not 3 (batching.priority_levels)"),
    ({}, "batching: {preserve_ordering: true, default_queue_policy: {timeout_action: delay}}",
     "batching.default_queue_policy.timeout_action", "delay does not go with preserve_ordering"),
    ({}, "batching: {preserve_ordering: true, priority_queue_policy: {1: {timeout_action: delay, "
         "default_timeout_ms: 5}}}", "batching.priority_queue_policy.1.timeout_action",
     "(Triton refuses the pair too)"),
])
def test_preserve_ordering_beside_what_triton_refuses_with_it_fails_naming_both(tmp_path, server, model, path, said):
    defaults = load_server_config(None, server).model_defaults
    with pytest.raises(ConfigError) as info:
        load_model_config(write(tmp_path, model + "\n", "m.yaml"), defaults)
    assert info.value.path == path and said in info.value.problem
    # without a deadline, delay never moves a request: Triton takes it, and so does aclserve
    assert load_model_config(write(tmp_path, "batching: {preserve_ordering: true, default_queue_policy: "
                                             "{timeout_action: delay, default_timeout_ms: 0}}\n", "m.yaml"),
                             ModelConfig()).batching.preserve_ordering
