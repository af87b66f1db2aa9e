"""Numbers YAML 1.1 reads otherwise than they look (config/yaml_numbers.py): `port: 07000` was
taken as 3584 (octal), `instances: 010` as 8 and `shutdown_timeout_s: 1:30` as 90 (base 60)
without a word, and `port: 0800` (not octal, so text) was told "YAML reads a number like 1e9 as
text" (an independent tester's findings). Now refused where they are written, in the server's
file and a model's alike, naming the key and what to write; text stays text."""
from __future__ import annotations

import pytest

from aclserve.config import ConfigError, ModelConfig, load_model_config, load_server_config
from aclserve.config.files import read_yaml
from tests.config_files import write


@pytest.mark.parametrize("text, said", [
    ("port: 07000\n", 'port: 07000 has a leading zero, which YAML 1.1 reads as octal (3584): write 7000, '
                      'or "07000" in quotes for text'),
    ("model_defaults: {instances: 010}\n", "model_defaults.instances: 010 has a leading zero, which YAML 1.1 "
                                           "reads as octal (8): write 10"),
    ("shutdown_timeout_s: 1:30\n", "shutdown_timeout_s: 1:30 is base 60 in YAML 1.1 (90): write one plain number"),
    ("settle_s: 1:30.5\n", "settle_s: 1:30.5 is base 60 in YAML 1.1 (90.5): write one plain number"),
    ("model_defaults:\n  devices: [0, 01]\n", "model_defaults.devices[1]: 01 has a leading zero"),
    ("model_defaults:\n  batching:\n    priority_queue_policy:\n      02: {max_queue_size: 3}\n",
     "model_defaults.batching.priority_queue_policy: the key 02 has a leading zero, which YAML 1.1 reads as octal"),
    ("api_token: 0123\n", 'api_token: 0123 has a leading zero, which YAML 1.1 reads as octal (83): write 123, '
                          'or "0123" in quotes for text'),  # (a token's text: quoting is the answer)
    # what was text all along is said for what it is, not "a number like 1e9"
    ("port: 0800\n", "port: must be an integer, got '0800' (0800 has a leading zero, which YAML 1.1 reads as "
                     "text, and 0700 as octal: write 800)"),
    ("port: '07000'\n", "port: must be an integer, got '07000' (07000 has a leading zero, which YAML 1.1 reads as "
                        "octal (3584): write 7000)"),
    ("shutdown_timeout_s: 0:30\n", "shutdown_timeout_s: must be a number, got '0:30' (0:30 is text in YAML 1.1, "
                                   "which reads 1:30 as base 60: write one plain number)"),
    ("port: 0o17\n", "port: must be an integer, got '0o17' (0o17 is text in YAML 1.1, which has no 0o prefix: "
                     "write 15)"),
])
def test_a_number_yaml_reads_otherwise_than_it_looks_is_refused_naming_its_key(tmp_path, text, said):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_server_config(path)
    assert str(info.value).startswith(f"{path}: ") and said in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


def test_a_models_own_file_is_read_alike(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_model_config(write(tmp_path, "instances: 010\n", "m.yaml"), ModelConfig())
    assert str(info.value).startswith(f"{tmp_path / 'm.yaml'}: instances: 010 has a leading zero"), str(info.value)
    with pytest.raises(ConfigError, match=r"batching\.max_queue_delay_ms: 1:30 is base 60"):
        load_model_config(write(tmp_path, "batching: {max_queue_delay_ms: 1:30}\n", "m.yaml"), ModelConfig())


def test_quoted_they_are_text_and_numbers_that_read_as_they_look_are_taken(tmp_path):
    """Quoted text, 0 itself, hexadecimal and binary prefixes, `_` between digits (YAML 1.1's
    digit separator), floats with a leading zero, and text with colons (an input shape) are
    taken; the same token unquoted is refused with the quotes as the way out."""
    text = ('api_token: "0123"\nhost: "0800"\nport: 0\ngrpc_port: 0\nmax_body_bytes: 0x4000000\n'
            "max_json_bytes: 0b1000000000000000000000000\nmax_inflight_bytes: 1_073_741_824\n"
            "memory_reserve_fraction: 00.5\nmodel_defaults:\n  devices: [0, 1]\n"
            "  version_policy: {specific: [1, 2]}\n  compile: {input_shape: \"x:1,3,224,224\"}\n")
    config = load_server_config(write(tmp_path, text))
    assert (config.api_token, config.host, config.port) == ("0123", "0800", 0)
    assert (config.max_body_bytes, config.max_json_bytes, config.max_inflight_bytes) == (64 << 20, 16 << 20, 1 << 30)
    assert config.memory_reserve_fraction == 0.5 and config.model_defaults.devices == (0, 1)
    assert config.model_defaults.compile.input_shape == "x:1,3,224,224"
    with pytest.raises(ConfigError, match='^.*: api_token: 0123 has a leading zero.*or "0123" in quotes for text$'):
        load_server_config(write(tmp_path, text.replace('"0123"', "0123")))


def test_a_scalar_many_aliases_name_is_looked_at_once_and_said_short(tmp_path):
    """The check walks the file's nodes, each once (an alias bomb's billion names of one list
    stay one list), and a long scalar is named by its start."""
    levels = ["&k0 [010, 1, 2]"] + [f"&k{i} [" + ", ".join([f"*k{i - 1}"] * 10) + "]" for i in range(1, 9)]
    with pytest.raises(ConfigError, match=r"host\[0\]\[0\]"):
        load_server_config(write(tmp_path, "host: [" + ", ".join(levels) + "]\n"))
    with pytest.raises(ConfigError) as info:
        load_server_config(write(tmp_path, "port: 0" + "7" * 5000 + "\n"))
    assert "has a leading zero" in str(info.value) and len(str(info.value)) < 300, str(info.value)[:400]


@pytest.mark.parametrize("text, said", [
    ('port: "0_"\n', "port: must be an integer, got '0_' (a number in quotes is text: write it without quotes)"),
    ('port: "-0_"\n', "port: must be an integer, got '-0_' (a number in quotes is text: write it without quotes)"),
    ('port: "0o_"\n', "port: must be an integer, got '0o_'"),  # (unquoted it is text too: no number to advise)
])
def test_a_zero_and_separators_alone_is_no_misread_number(tmp_path, text, said):
    """No digit after the zero: no leading zero to advise on (`int('', 8)` raised out of the hint,
    a traceback at start-up: a reviewer); quoted it is text refused as such, plain YAML 1.1 reads
    it as 0."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_server_config(path)
    assert info.value.path == "port" and str(info.value) == f"{path}: {said}"
    assert load_server_config(write(tmp_path, "port: 0_\n")).port == 0


@pytest.mark.parametrize("text, said", [
    ("request_log: yes\n", "request_log: yes is a boolean in YAML 1.1 (true): write true"),
    ("request_log: Off\n", "request_log: Off is a boolean in YAML 1.1 (false): write false"),
    ("host: NO\n", 'host: NO is a boolean in YAML 1.1 (false): write "NO" in quotes'),
    ("api_token: no\n", 'api_token: no is a boolean in YAML 1.1 (false): write "no" in quotes'),
    ("model_defaults:\n  devices: [0, ON]\n", "model_defaults.devices[1]: ON is a boolean in YAML 1.1 (true)"),
    ("trace: {level: Yes}\n", "trace.level: Yes is a boolean in YAML 1.1 (true)"),
    ("on: 1\n", 'the key on is a boolean in YAML 1.1 (true): write "on" in quotes'),
    ("images:\n  OFF: 1\n", "images: the key OFF is a boolean in YAML 1.1 (false)"),
])
def test_a_word_yaml_reads_as_a_boolean_is_refused_naming_its_key(tmp_path, text, said):
    """YAML 1.1 (PyYAML) reads yes, no, on and off (in three cases each) as booleans: `host: NO`
    (a country code, a name) became False and was refused as "must be a non-empty string, got False", a
    key `on:` became the key True, `request_log: yes` was taken for true. Each is refused where it
    is written, as the misread numbers are."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_server_config(path)
    assert str(info.value).startswith(f"{path}: ") and said in str(info.value), str(info.value)


def test_an_unquoted_off_for_the_trace_level_offers_no_boolean(tmp_path):
    """`trace: {level: OFF}` said to write "OFF" in quotes, "or false for the boolean", which the
    level refuses (a tester, t92): the quotes alone, as for a key."""
    with pytest.raises(ConfigError) as info:
        load_server_config(write(tmp_path, "trace: {level: OFF}\n"))
    assert str(info.value).endswith('c.yaml: trace.level: OFF is a boolean in YAML 1.1 (false): write "OFF" in '
                                    'quotes'), str(info.value)
    assert load_server_config(write(tmp_path, 'trace: {level: "OFF"}\n')).trace.level == "OFF"


def test_true_and_false_are_booleans_and_quoted_words_are_text(tmp_path):
    """true and false as PyYAML takes them (three cases) are booleans; y and n are text to PyYAML;
    a quoted word is text, judged by the key's own check; a model's own file is read alike."""
    config = load_server_config(write(tmp_path, 'request_log: TRUE\nunload_on_delete: False\nhost: "NO"\n'
                                                'api_token: y\n'))
    assert (config.request_log, config.unload_on_delete, config.host, config.api_token) == (True, False, "NO", "y")
    with pytest.raises(ConfigError, match=r"request_log: must be true or false, got 'yes'$"):
        load_server_config(write(tmp_path, "request_log: 'yes'\n"))
    with pytest.raises(ConfigError) as info:
        load_model_config(write(tmp_path, "batching: {preserve_ordering: on}\n", "m.yaml"), ModelConfig())
    assert str(info.value) == (f'{tmp_path / "m.yaml"}: batching.preserve_ordering: on is a boolean in YAML 1.1 '
                               '(true): write true'), str(info.value)


def _nested(path: list[str], value: str) -> str:
    """The YAML of a mapping holding `value` at `path` (one key a level)."""
    return "".join(f"{'  ' * depth}{key}:\n" for depth, key in enumerate(path[:-1])) + \
        f"{'  ' * (len(path) - 1)}{path[-1]}: {value}\n"


def _leaves(mapping: dict, path=()):
    for key, value in mapping.items():
        if isinstance(value, dict):
            yield from _leaves(value, path + (key,))
        else:
            yield path + (key,), value


def _said(tmp_path, text: str, model: bool = False) -> str:
    """What reading a server's config file (read_yaml, which refuses the word for load_server_config:
    a whole load took 60 ms a key), or loading a model's, says of `text`."""
    with pytest.raises(ConfigError) as info:
        if model:
            load_model_config(write(tmp_path, text, "m.yaml"), ModelConfig())
        else:
            read_yaml(write(tmp_path, text))
    return info.value.problem


def test_a_word_read_as_a_boolean_is_offered_as_the_boolean_only_where_the_key_takes_one(tmp_path):
    """Every key was told to quote the word for text or write the boolean: a text key (`host: NO`,
    `models_dir: off`) was offered a boolean it refuses, a boolean key (`request_log: yes`) text it
    refuses (a tester, t92). Every key of configs/default.yaml, model_defaults' in a model's own file
    too (the keys that take one are read from the config's schema: one missed fails here), and a
    model's that it does not list."""
    import yaml
    from tests import REPO
    defaults = yaml.safe_load((REPO / "configs" / "default.yaml").read_text())
    for path, default, model in [*((path, default, False) for path, default in _leaves(defaults)),
                                 *((path, default, True) for path, default in _leaves(defaults["model_defaults"]))]:
        expected = "write false" if isinstance(default, bool) else 'write "off" in quotes'
        said = _said(tmp_path, _nested(list(path), "off"), model=model)
        assert said == f"off is a boolean in YAML 1.1 (false): {expected}", (path, model, said)
    for text, expected in [("inputs: {x: {image: {invert: on}}}", "write true"),
                           ("batching: {priority_queue_policy: {1: {allow_timeout_override: on}}}", "write true"),
                           ("version_policy: {all: on}", "write true"),
                           ("inputs: {x: {image: {color: on}}}", 'write "on" in quotes'),
                           ("outputs: {y: {labels: on}}", 'write "on" in quotes')]:
        said = _said(tmp_path, text + "\n", model=True)
        assert said == f"on is a boolean in YAML 1.1 (true): {expected}", (text, said)


def test_a_boolean_key_in_another_case_is_told_the_key_s_spelling_not_the_quotes(tmp_path):
    """`version_policy: {ALL: yes}` was told to write "yes" in quotes, which `all` refuses, where the
    policy's kinds are read in any case (`{ALL: true}` is taken): it is told to write true, as
    `{all: yes}` is. A key the config reads only in lower case (`batching: {Enabled: yes}`) was told
    the quotes too, then that the key is unknown: it is told the key's spelling, and the boolean."""
    for text in ("{all: yes}", "{ALL: yes}", "{All: yes}"):
        said = _said(tmp_path, f"version_policy: {text}\n", model=True)
        assert said == "yes is a boolean in YAML 1.1 (true): write true", (text, said)
    for text in ("{All: true}", "{ALL: true}"):
        assert load_model_config(write(tmp_path, f"version_policy: {text}\n", "m.yaml"),
                                 ModelConfig()).version_policy == ("all",)
    for text, model, key in [("batching: {Enabled: no}", True, "batching.enabled"),
                             ("Batching: {enabled: no}", True, "batching.enabled"),
                             ("Version_Policy: {all: no}", True, "version_policy.all"),
                             ("Request_Log: no", False, "request_log")]:
        said = _said(tmp_path, text + "\n", model)
        assert said == (f"no is a boolean in YAML 1.1 (false), and the key is {key}, in lower case (keys are "
                        f"case-sensitive): write {key}: false"), (text, said)
    # a key of no boolean, in any case, is told the quotes still
    assert _said(tmp_path, "version_policy: {Latest: yes}\n", model=True) == \
        'yes is a boolean in YAML 1.1 (true): write "yes" in quotes'


def test_a_bool_field_no_key_sets_is_no_key_that_takes_a_boolean(tmp_path):
    """The keys that take a boolean were read from every bool field of the schema, so a field no YAML
    key sets (a config.pbtxt's batch_from_pbtxt, labels_as_triton, priorities_off; the resolved
    counts_rows) was offered the boolean ("write true"), which then was refused as an unknown key: it
    is told what any unknown key is, the quotes, and quoted, that the key is unknown."""
    for text, model, key in [("batch_from_pbtxt: yes", True, "batch_from_pbtxt"),
                             ("model_defaults: {batch_from_pbtxt: yes}", False, "model_defaults.batch_from_pbtxt"),
                             ("batching: {priorities_off: yes}", True, "batching.priorities_off"),
                             ("batching: {default_queue_policy: {counts_rows: yes}}", True,
                              "batching.default_queue_policy.counts_rows"),
                             ("outputs: {y: {labels_as_triton: yes}}", True, "outputs.y.labels_as_triton")]:
        said = _said(tmp_path, text + "\n", model)
        assert said == 'yes is a boolean in YAML 1.1 (true): write "yes" in quotes', (text, said)
        quoted = write(tmp_path, text.replace("yes", '"yes"') + "\n", "m.yaml" if model else "c.yaml")
        with pytest.raises(ConfigError) as info:
            load_model_config(quoted, ModelConfig()) if model else load_server_config(quoted)
        assert (info.value.path, info.value.problem.split(" (")[0]) == (key, "unknown key"), str(info.value)
