"""A Triton model folder's config.pbtxt read as the model's settings (config/triton_config.py):
served with its batching, priority levels, queue policies, instances and version policy, as
/v2/models/<m>/config shows them; a config.yaml beside it wins; a parse error or a field aclserve
cannot honour is the model's problem in the index; editing or adding the file reloads the model.
The pure translation on temporary folders (layout.scan), the rest on the real server and
repository (CPU runtime, real files)."""
from __future__ import annotations

import logging
import os

import aiohttp
import numpy as np
import onnx
import pytest
from google.protobuf import text_format
from onnx import TensorProto, helper, numpy_helper

from aclserve.config import ModelConfig, load_server_config
from aclserve.repository import State
from aclserve.repository.layout import scan
from aclserve.repository.models_folder import OUTSIDE

from tests.serving import started_app

from .repo_helpers import http_index, place, started_on_old_files, until, write_in, x_rows

DEFAULTS = ModelConfig()

TRITON = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "y_labels.txt" } ]
dynamic_batching {
  max_queue_delay_microseconds: 500
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy { max_queue_size: 16 timeout_action: DELAY default_timeout_microseconds: 100000
                         allow_timeout_override: true }
  priority_queue_policy { key: 1 value: { max_queue_size: 4 } }
}
instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0 ] } ]
version_policy: { specific { versions: [ 1 ] } }
optimization { graph { level: 1 } }
"""


def touch(path, data=b"om"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def triton_folder(root, name: str, pbtxt: str, versions=(1,)):
    for version in versions:
        touch(root / name / str(version) / "model.onnx")
    (root / name / "config.pbtxt").write_text(pbtxt)


def scanned(tmp_path, defaults=DEFAULTS):
    result = scan(tmp_path, defaults)
    return result, {name: entry.config for name, entry in result.models.items()}


def test_a_scan_parses_each_config_pbtxt_once(tmp_path, monkeypatch):
    """A scan parsed a config.pbtxt twice (its default_model_filename to pick the version files,
    then its settings), and parsed one resolving outside the repository for the first, which it
    then refused unread. Now one parse serves both, and the file outside is not read."""
    parsed, parse = [], text_format.Parse

    def counted(text, *args, **kwargs):
        parsed.append(text)
        return parse(text, *args, **kwargs)
    monkeypatch.setattr(text_format, "Parse", counted)
    triton_folder(tmp_path / "models", "m", 'default_model_filename: "model.onnx"\nmax_batch_size: 4\n')
    triton_folder(tmp_path, "outside", 'default_model_filename: "model.onnx"\n')
    touch(tmp_path / "models" / "away" / "1" / "model.onnx")
    os.symlink(tmp_path / "outside" / "config.pbtxt", tmp_path / "models" / "away" / "config.pbtxt")
    result, configs = scanned(tmp_path / "models")
    assert configs["m"].batching.batch_cap == 4
    assert result.problems["away"].endswith(f"config.pbtxt: config file {OUTSIDE}")
    assert parsed == ['default_model_filename: "model.onnx"\nmax_batch_size: 4\n']


def test_the_pbtxt_is_translated_with_tritons_meaning(tmp_path):
    tensors = ('input [ {{ name: "x" data_type: TYPE_FP32 dims: {dims} }} ]\n'
               'output [ {{ name: "y" data_type: TYPE_FP32 dims: {dims} }} ]\n')
    triton_folder(tmp_path, "m", TRITON.replace('label_filename: "y_labels.txt"', ""), versions=(1, 2))
    row, whole = tensors.format(dims="[ 4 ]"), tensors.format(dims="[ -1, 4 ]")
    triton_folder(tmp_path, "plain", f"max_batch_size: 8\n{row}instance_group [ {{ count: 3 kind: KIND_CPU }} ]\n")
    triton_folder(tmp_path, "whole", f"max_batch_size: 0\n{whole}version_policy: {{ latest {{ num_versions: 2 }} }}\n"
                                     "dynamic_batching { }\ninstance_group [ { count: 2 } ]\n", versions=(1, 2, 3))
    triton_folder(tmp_path, "partial", "max_batch_size: 8\n")  # completed as Triton's ONNX Runtime backend does
    triton_folder(tmp_path, "empty", "")
    # model_defaults' levels and queue policy stay out of a dynamic_batching the file gives
    defaults = load_server_config(None, {"model_defaults.batching.priority_queue_policy": {1: {"max_queue_size": 9}},
                                         "model_defaults.devices": [0, 1], "model_defaults.slots": 3}).model_defaults
    result, configs = scanned(tmp_path, defaults)
    assert result.problems == {}
    m = configs["m"]
    assert (m.instances, m.devices, m.version_policy) == (2, (0,), ("specific", (1,)))
    assert result.models["m"].selected == ("1",)
    b = m.batching
    assert (b.enabled, b.batch_cap, b.max_queue_delay_ms, b.priority_levels, b.default_level) == (True, 4, 0.5, 2, 2)
    assert (b.default_queue_policy.max_queue_size, b.default_queue_policy.default_timeout_ms,
            b.default_queue_policy.timeout_action, b.default_queue_policy.allow_timeout_override) == (16, 100, "delay",
                                                                                                      True)
    # a level's policy is whole, as Triton reads it: what it leaves out is Triton's default
    level = b.priority_queue_policy[1]
    assert (level.max_queue_size, level.default_timeout_ms, level.timeout_action, level.allow_timeout_override) \
        == (4, 0, "reject", False)
    assert list(b.priority_queue_policy) == [1] and m.slots == 3  # what Triton has no field for: model_defaults'

    plain = configs["plain"]  # no dynamic_batching: Triton runs requests one at a time
    assert (plain.batching.enabled, plain.batching.batch_cap, plain.instances) == (False, 8, 3)
    assert plain.batching.priority_queue_policy == defaults.batching.priority_queue_policy  # (none given: defaults')
    whole = configs["whole"]  # dynamic_batching { }: Triton's defaults, not model_defaults'
    assert (whole.batching.enabled, whole.batching.max_queue_delay_ms, whole.batching.priority_levels) == (False, 0, 1)
    # Triton's priority_levels 0, run as one level: /config shows 0 as Triton does (it showed 1)
    assert whole.batching.priorities_off and not b.priorities_off and not plain.batching.priorities_off
    policy = whole.batching.default_queue_policy
    assert (policy.max_queue_size, policy.default_timeout_ms, policy.allow_timeout_override) == (0, 0, False)
    assert whole.batching.priority_queue_policy == {}
    assert (whole.instances, whole.devices) == (4, (0, 1))  # KIND_AUTO, no gpus: 2 on each default device
    assert result.models["whole"].selected == ("2", "3")
    for completed, cap in ((configs["partial"], 8), (configs["empty"], 0)):  # batched as dynamic_batching { }
        assert (completed.batching.enabled, completed.batching.batch_cap, completed.batching.max_queue_delay_ms,
                completed.batching.priority_levels, completed.batching.default_queue_policy.max_queue_size) \
            == (True, cap, 0, 1, 0)
        assert completed.batching.priorities_off  # (Triton's completion adds dynamic_batching { }: 0 levels)
    assert sorted(result.notes) == [
        "empty/config.pbtxt: max_batch_size 0 with no input or output listed: the model's, batched as "
        "dynamic_batching { }, as Triton's ONNX Runtime backend completes such a config (its largest compiled batch "
        "size here; Triton's default-max-batch-size: 4)",
        "m/config.pbtxt: passed over (aclserve's answers and scheduling do not depend on them): optimization, "
        "platform and backend (the model runs as an OM; an .onnx is compiled to one)",  # (data_type, dims: checked)
        "partial/config.pbtxt: no dynamic_batching and no input or output listed, batched as dynamic_batching { }, "
        "as Triton's ONNX Runtime backend completes such a config",
        "plain/config.pbtxt: instance_group[0] KIND_CPU: its instances run on the model's devices, as all do here",
        "plain/config.pbtxt: no dynamic_batching: requests run one at a time, as Triton runs them "
        "(dynamic_batching { } batches them), under model_defaults' priority levels and queue limits "
        "(Triton's has none)",
        "whole/config.pbtxt: max_batch_size 0: requests run one at a time, each whole, as Triton runs a model "
        "without a batch dimension (a model compiled with batch sizes shows its largest as max_batch_size)"]


def test_the_note_of_a_completed_config_names_what_it_leaves_out(tmp_path):
    """A config.pbtxt that lists its inputs but no output is completed as one listing neither; its
    note said "no input or output listed", which reads as neither (an independent tester): it
    names the one left out."""
    listed = {"input": 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]\n',
              "output": 'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'}
    triton_folder(tmp_path, "inputs", "max_batch_size: 8\n" + listed["input"])
    triton_folder(tmp_path, "outputs", "max_batch_size: 0\n" + listed["output"])
    result, configs = scanned(tmp_path)
    assert configs["inputs"].batching.enabled and configs["outputs"].batching.enabled  # completed: batched
    assert sorted(result.notes) == [
        "inputs/config.pbtxt: no dynamic_batching and no output listed, batched as dynamic_batching { }, as "
        "Triton's ONNX Runtime backend completes such a config",
        "outputs/config.pbtxt: max_batch_size 0 with no input listed: the model's, batched as dynamic_batching { }, "
        "as Triton's ONNX Runtime backend completes such a config (its largest compiled batch size here; Triton's "
        "default-max-batch-size: 4)"]


@pytest.mark.parametrize("pbtxt, problem", [
    ('name: "other"', "name: is 'other', not the model's folder name 'm' (Triton refuses it too)"),
    ('platform: "tensorrt_plan"', "platform: 'tensorrt_plan': aclserve serves ONNX and OM models"),
    ("sequence_batching { }", "sequence_batching: aclserve has no sequence batcher: a stateful model's requests would "
                              "run without their sequence's state (a model that keeps no state between requests: "
                              "remove it)"),
    ("model_transaction_policy { decoupled: true }", "model_transaction_policy.decoupled: aclserve answers each "
                                                     "request once (a model that answers each once: remove decoupled)"),
    ('ensemble_scheduling { step [ { model_name: "a" } ] }', "ensemble_scheduling: aclserve serves single models"),
    ("max_batch_size: 4\ndynamic_batching { priority_levels: 2 }",
     "dynamic_batching.default_priority_level: must be within 1..2 (priority_levels), got 0"),
    ("max_batch_size: 4\ndynamic_batching { priority_levels: 2 default_priority_level: 1 preserve_ordering: true }",
     "dynamic_batching.preserve_ordering: takes one priority level, not 2"),
    ("instance_group [ { count: 1 gpus: [ 0 ] }, { count: 2 gpus: [ 1 ] } ]",
     "instance_group: places 1 on device 0, 2 on device 1: aclserve spreads a model's instances evenly"),
    ("instance_group [ { count: 1 passive: true } ]", "instance_group[0].passive: passive instances take no requests"),
    ("version_policy { specific { versions: [ 0 ] } }", "version_policy.specific.versions: must list versions"),
    ("max_batch_size: 4\ndynamic_batching { max_queue_delay_microseconds: 9999999999999 }",
     "dynamic_batching.max_queue_delay_microseconds: is 9999999999999, at most 2147483647000"),
    # input and output fields Triton refuses before it looks at the model (the model's own: test_pbtxt_tensors.py)
    ('output [ { name: "y" data_type: TYPE_FP32 dims: [ 3, 4 ] reshape: { shape: [ 10 ] } } ]',
     "output[0].reshape: shape [10] does not hold the elements of dims [3, 4] (the same count, and the same number "
     "of -1 dimensions with the same count between them; Triton refuses it too)"),
    ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, -1, 4 ] reshape: { shape: [ 8, -1 ] } } ]',
     "input[0].reshape: shape [8, -1] does not hold the elements of dims [2, -1, 4]"),
    ('input [ { name: "x" data_type: TYPE_FP32 reshape: { shape: [ 4 ] } } ]',
     "input[0].dims: must be given for 'x' (Triton refuses a tensor without dims)"),
    ('output [ { name: "y" dims: [ 4 ] } ]', "output[0].data_type: must be given for 'y' (Triton refuses a tensor "
                                            "without data_type)"),
    ('max_batch_size: 0\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]\n'
     'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]',
     "input[0].reshape: cannot be empty with max_batch_size 0: the tensor would hold no data (Triton refuses it too)"),
    ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 0 ] } ]',
     "input[0].dims: [0]: a dimension is at least 1, or -1 for a variable one"),
    ('output [ { dims: [ 4 ] } ]', "output[0].name: must be given (Triton refuses a tensor without a name)"),
    ("max_batch_size: 4\ndynamic_batching {\n  priority_levels: 1\n  default_priority_level: 1\n"
     "  max_queue_size: 3\n}", 'invalid text format: line 5, column 3: Message type "inference.ModelDynamicBatching" '
                              'has no field named "max_queue_size".'),
])
def test_what_cannot_be_honoured_is_the_models_problem_naming_the_field(tmp_path, pbtxt, problem):
    triton_folder(tmp_path, "m", pbtxt)
    result, _ = scanned(tmp_path)
    assert "m" not in result.models
    source = str((tmp_path / "m" / "config.pbtxt").resolve())
    assert result.problems["m"].startswith(f"{source}: {problem}"), result.problems
    assert result.config_problems["m"][0] == source  # (one being written waits: planner.py)


def test_a_config_yaml_beside_it_wins(tmp_path):
    triton_folder(tmp_path, "m", "instance_group [ { count: 3 } ]\nsequence_batching { }\n")
    (tmp_path / "m" / "config.yaml").write_text("instances: 2\n")
    result, configs = scanned(tmp_path)
    assert result.problems == {} and configs["m"].instances == 2
    assert result.notes == ["m/config.pbtxt not read: m/config.yaml beside it is (a model's settings come from one "
                            "file)"]


@pytest.mark.asyncio
async def test_a_triton_folder_serves_with_its_config(models_dir, model_files, caplog):
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    for version in (1, 2):
        place(model_files[version]["om"], models_dir / "m" / str(version) / "model.om")
    write_in(models_dir / "m" / "config.pbtxt", TRITON)
    write_in(models_dir / "m" / "y_labels.txt", "a\nb\nc\nd\n")
    place(model_files[3]["om"], models_dir / "yaml" / "1" / "model.om")
    write_in(models_dir / "yaml" / "config.pbtxt", 'name: "yaml"\ninstance_group [ { count: 3 } ]\n')
    write_in(models_dir / "yaml" / "config.yaml", "instances: 2\n")
    place(model_files[1]["om"], models_dir / "broken" / "1" / "model.om")
    write_in(models_dir / "broken" / "config.pbtxt", "max_batch_size: 4\ndynamic_batching {\n")
    place(model_files[1]["om"], models_dir / "stateful" / "1" / "model.om")
    write_in(models_dir / "stateful" / "config.pbtxt", "max_batch_size: 4\nsequence_batching { }\n")
    runner, _, base, _, repo = await started_on_old_files(models_dir)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/v2/models/m/config") as resp:
                assert resp.status == 200
                shown = await resp.json()
            async with session.post(f"{base}/v2/repository/index", json={}) as resp:
                index = {(r["name"], r.get("version", "")): r for r in await resp.json()}
            async with session.get(f"{base}/v2/models/yaml/config") as resp:
                assert (await resp.json())["instance_group"][0]["count"] == 2
        assert shown["max_batch_size"] == 4 and shown["version_policy"] == {"specific": {"versions": [1]}}
        assert shown["instance_group"][0]["count"] == 2 and shown["output"][0]["label_filename"] == "y_labels.txt"
        dynamic = shown["dynamic_batching"]
        assert (dynamic["max_queue_delay_microseconds"], dynamic["priority_levels"],
                dynamic["default_priority_level"]) == (500, 2, 2)
        assert dynamic["default_queue_policy"] == {"timeout_action": "DELAY", "default_timeout_microseconds": 100000,
                                                   "allow_timeout_override": True, "max_queue_size": 16}
        assert dynamic["priority_queue_policy"] == {"1": {"timeout_action": "REJECT", "default_timeout_microseconds": 0,
                                                          "allow_timeout_override": False, "max_queue_size": 4}}
        assert (await repo.get("m").infer(x_rows(), 1)).outputs["y"][0, 0] == 1.0  # version 1, as its policy says
        assert index[("m", "1")]["state"] == State.READY.value
        assert index[("m", "2")]["reason"] == "not selected by the version policy"
        assert index[("broken", "")]["reason"] == ('<models>/broken/config.pbtxt: invalid text format: line 2, '
                                                   'column 18: Expected "}".')
        assert index[("stateful", "")]["reason"] == ("<models>/stateful/config.pbtxt: sequence_batching: aclserve has "
                                                     "no sequence batcher: a stateful model's requests would run "
                                                     "without their sequence's state (a model that keeps no state "
                                                     "between requests: remove it)")
        assert "yaml/config.pbtxt not read: yaml/config.yaml beside it is" in caplog.text
        assert "m/config.pbtxt: passed over (aclserve's answers and scheduling do not depend on them): optimization" \
            in caplog.text
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
async def test_editing_or_adding_a_config_pbtxt_reloads_the_model(make_repo, models_dir, model_files):
    place(model_files[1]["om"], models_dir / "m" / "1" / "model.om")
    repo, events = await make_repo()
    assert repo.get("m").config.batching.priority_levels == 3  # the defaults: no config yet
    write_in(models_dir / "m" / "config.pbtxt", "max_batch_size: 2\ndynamic_batching { priority_levels: 2 "
                                                "default_priority_level: 1 }\n")
    await events.wait("reloaded", "m", "1", limit_s=60)  # (a hang guard under pytest.ini's timeout)
    batching = repo.get("m").config.batching
    assert (batching.priority_levels, batching.default_level, batching.batch_cap) == (2, 1, 2)
    assert repo.get("m").max_batch_size == 2
    write_in(models_dir / "m" / "config.pbtxt", 'max_batch_size: 4\n'
                                                'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
                                                'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
                                                "instance_group [ { count: 2 } ]\n")
    await events.wait("reloaded", "m", "1", count=2, limit_s=60)
    assert (repo.get("m").config.instances, repo.get("m").config.batching.enabled) == (2, False)  # (no batcher)
    write_in(models_dir / "m" / "config.pbtxt", "max_batch_size: -1\n")  # broken: what serves stays
    await until(lambda: any(r["name"] == "m" and not r["version"] for r in repo.index()), "its problem indexed")
    (problem,) = [r["reason"] for r in repo.index() if r["name"] == "m" and not r["version"]]
    assert problem.endswith("m/config.pbtxt: max_batch_size: must be >= 0, got -1 (Triton refuses it too)")
    assert (await repo.get("m").infer(x_rows(), 1)).outputs["y"][0, 0] == 1.0


@pytest.mark.asyncio
async def test_a_version_policy_choosing_no_kind_serves_every_version_and_latest_of_none_is_refused(
        models_dir, model_files):
    """Triton's VersionsToLoad: a policy naming no kind (`version_policy: { }`) loads every version
    (only the latest was served); `latest { }` (num_versions 0) selects none, and Triton refuses
    the model (it was served as latest 1)."""
    for name, policy in (("every", "version_policy: { }"), ("none", "version_policy: { latest { } }")):
        for version in (1, 2):
            place(model_files[version]["om"], models_dir / name / str(version) / "model.om")
        write_in(models_dir / name / "config.pbtxt", f"{policy}\n")
    runner, _, base, _, repo = await started_on_old_files(models_dir)
    try:
        index = await http_index(base)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/v2/models/every/config") as resp:
                assert (await resp.json())["version_policy"] == {"all": {}}
        assert index[("every", "1")][0] == index[("every", "2")][0] == State.READY.value
        assert (await repo.get("every", "1").infer(x_rows(), 1)).outputs["y"][0, 0] == 1.0
        assert index[("none", "")] == (State.UNAVAILABLE.value, "<models>/none/config.pbtxt: "
                                       "version_policy.latest.num_versions: is 0: it selects no version (Triton "
                                       "refuses the model too: at least one version must be available under the "
                                       "version policy)")
    finally:
        await runner.cleanup()


def _hundred_over_onnx(path) -> None:
    """y = 100 / x, INT32 [N, 2]: an integer division by the input, which zeros fail."""
    x = helper.make_tensor_value_info("x", TensorProto.INT32, ["N", 2])
    y = helper.make_tensor_value_info("y", TensorProto.INT32, ["N", 2])
    hundred = numpy_helper.from_array(np.array(100, np.int32), "hundred")
    graph = helper.make_graph([helper.make_node("Div", ["hundred", "x"], ["y"])], "over", [x], [y], [hundred])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.asyncio
async def test_model_warmup_random_data_warms_up_on_ones_and_a_failed_warm_up_says_so_in_pbtxt_words(
        models_dir, caplog):
    """A config.pbtxt has no warmup_data: model_warmup was passed over, so a model that cannot run
    on the warm-up's zeros never loaded, its reason suggesting `warmup_data: ones in its config`.
    Its random_data now warms up on ones (aclserve has no random data), its zero_data on zeros; the
    reason of a failed warm-up names what the pbtxt can say."""
    caplog.set_level(logging.INFO, logger="aclserve.repository")
    warmup = ('model_warmup [ {{ name: "w" batch_size: 1 inputs {{ key: "x" value: {{ data_type: TYPE_INT32 '
              'dims: [ 2 ] {} }} }} }} ]\n')
    for name, given in (("random", warmup.format("random_data: true")), ("plain", ""),
                        ("zeros", warmup.format("zero_data: true"))):
        _hundred_over_onnx(models_dir / name / "1" / "model.onnx")
        write_in(models_dir / name / "config.pbtxt", f"max_batch_size: 4\n{given}")
    for path in models_dir.rglob("*"):
        os.utime(path, (1, 1))
    config = load_server_config(None, {"models_dir": str(models_dir), "port": 0, "device": "cpu",
                                       "model_control_mode": "none", "log_level": "warning",
                                       "load_retry_initial_s": 600, "load_retry_max_s": 600})
    runner, _, _, _, repo = await started_app(config)
    try:
        result = await repo.get("random").infer({"x": np.array([[4, 5]], np.int32)}, 1)
        assert result.outputs["y"].tolist() == [[25, 20]]
        reasons = {r["name"]: r["reason"] for r in repo.index() if r["state"] == State.UNAVAILABLE.value}
        assert sorted(reasons) == ["plain", "zeros"]
        for reason in reasons.values():
            assert "the warm-up run on zeros failed" in reason and (
                " (if the model cannot run on zeros, a model_warmup in its config.pbtxt whose inputs give "
                "random_data warms it up on ones)" in reason), reason
        assert "random/config.pbtxt: model_warmup read as warmup_data ones (random_data: aclserve has no random " \
               "data; ones are its data other than zeros): aclserve warms every compiled batch size up, three runs " \
               "each, whatever the samples' batch_size, count and dims" in caplog.text
    finally:
        await runner.cleanup()


def test_an_unset_kind_cpu_count_follows_the_backend_triton_fills_in_from_the_model_file(tmp_path):
    """A tester's Triton repository: `instance_group [ { kind: KIND_CPU } ]` without a backend or
    platform made 1 instance of a model.onnx, where Triton fills the backend in from the file
    first and makes ONNX Runtime's 2. An .om gets 1: Triton has no backend to fill in for it."""
    cpu = "max_batch_size: 8\ninstance_group [ { kind: KIND_CPU } ]\n"
    triton_folder(tmp_path, "onnx", cpu)
    triton_folder(tmp_path, "named", 'platform: "onnxruntime_onnx"\n' + cpu)
    touch(tmp_path / "om" / "1" / "model.om")
    (tmp_path / "om" / "config.pbtxt").write_text(cpu)
    result, configs = scanned(tmp_path)
    assert result.problems == {}
    assert {name: config.instances for name, config in configs.items()} == {"onnx": 2, "named": 2, "om": 1}


def test_a_config_pbtxt_beginning_with_a_byte_order_mark_is_read(tmp_path):
    """A tester's config.pbtxt saved by an editor with a UTF-8 BOM failed "Expected identifier or
    number, got \\ufeff.": the mark is invisible to whoever reads the file, so it is left out."""
    triton_folder(tmp_path, "m", "")
    (tmp_path / "m" / "config.pbtxt").write_bytes(b"\xef\xbb\xbfmax_batch_size: 8\ninstance_group [ { count: 3 } ]\n")
    result, configs = scanned(tmp_path)
    assert result.problems == {} and configs["m"].instances == 3
