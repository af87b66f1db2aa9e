"""Where text goes, a value YAML reads as a date, a number or a boolean (a tensor's name too) is
refused saying to quote it; a trace setting of the wrong type is said in one wording, and an IPv6
host in brackets told to drop them. (Numbers YAML 1.1 reads otherwise than they look:
test_config_yaml_numbers.py.)"""
from __future__ import annotations

import re

import pytest

from aclserve.config import ConfigError, load_server_config
from tests.config_files import write


@pytest.mark.parametrize("text, said", [
    ("{level: abc}", "trace.level: expected OFF or TIMESTAMPS, got 'abc'"),  # (as written: it said ABC)
    ("{level: [1, 2]}", "trace.level: must be a string, got [1, 2]"),  # (it said "got 1, 2")
    ("{level: 1.5}", "trace.level: must be a string, got 1.5"),  # ("expected a string, got float")
    ("{level: null}", "trace.level: must be a string, got None"),  # ("must be a string or a number")
    ("{level: false}", 'trace.level: must be a string, got False (write "OFF" in quotes: YAML reads a bare OFF as '
                       'false)'),
    ("{format: [chrome]}", "trace.format: must be a string, got ['chrome']"),  # (a list was taken as its item)
    ("{file: [t.json]}", "trace.file: must be a string, got ['t.json']"),
    ("{rate: null}", "trace.rate: must be an integer, got None"),  # ("must be a string or a number")
])
def test_a_trace_setting_of_the_wrong_type_is_said_in_one_wording(tmp_path, text, said):
    """The file's trace keys said a wrong type five ways, as the trace API's values (Triton's
    strings and lists) were judged, and took a list for its item (a tester, t92): each key's type
    is the file's own now, said as every other key says it."""
    with pytest.raises(ConfigError) as info:
        load_server_config(write(tmp_path, f"trace: {text}\n"))
    assert str(info.value).endswith(f"c.yaml: {said}"), str(info.value)


@pytest.mark.parametrize("text, said", [
    ("host: 2001-12-14", "host: must be a non-empty string, got datetime.date(2001, 12, 14) (YAML reads it as a "
                         "date: write it in quotes for text)"),
    ("trace_dir: 2001-12-14 10:00:00", "trace_dir: must be a non-empty string, got datetime.datetime(2001, 12, 14, "
                                       "10, 0) (YAML reads it as a date: write it in quotes for text)"),
    ("models_dir: 2024", "models_dir: must be a non-empty string, got 2024 (YAML reads it as a number: write it in "
                         "quotes for text)"),
    ("trace: {file: 2001-12-14}", "trace.file: must be a string, got datetime.date(2001, 12, 14) (YAML reads it as "
                                  "a date: write it in quotes for text)"),
    # (taken as the file "16", as 2024, 0, -1 and 0b11 were: traces went to ./16, a tester, t92)
    ("trace: {file: 0x10}", "trace.file: must be a string, got 16 (YAML reads it as a number: write it in quotes for "
                            "text)"),
    ("trace: {file: 0b11}", "trace.file: must be a string, got 3 (YAML reads it as a number: write it in quotes for "
                            "text)"),
    ("model_defaults: {outputs: {y: {labels: 2001-12-14}}}", "model_defaults.outputs.y.labels: must be a non-empty "
     "string, got datetime.date(2001, 12, 14) (YAML reads it as a date: write it in quotes for text)")])
def test_a_date_or_number_yaml_reads_where_text_goes_is_refused_saying_to_quote_it(tmp_path, text, said):
    """`host: 2001-12-14` said only "got datetime.date(2001, 12, 14)" (a configuration tester's finding)."""
    with pytest.raises(ConfigError) as info:
        load_server_config(write(tmp_path, text + "\n"))
    assert str(info.value).endswith(f"c.yaml: {said}"), str(info.value)
    quoted = re.sub(r": ([0-9][^}]*)(}*)$", r': "\1"\2', text)  # (quoted, each is text and taken)
    load_server_config(write(tmp_path, quoted + "\n"))


def test_a_tensor_named_by_a_number_yaml_reads_is_refused_saying_to_quote_it(tmp_path):
    """A tensor's name is a mapping's key: `0x10:` named the output "16" (str() of YAML's number),
    as trace.file took 0x10 for the file "16" (a tester, t92)."""
    with pytest.raises(ConfigError) as info:
        load_server_config(write(tmp_path, "model_defaults: {outputs: {0x10: {labels: l.txt}}}\n"))
    assert str(info.value).endswith("c.yaml: model_defaults.outputs: the key 16 must be a tensor's name, a string "
                                    "(YAML reads it as a number: write it in quotes for text)"), str(info.value)
    config = load_server_config(write(tmp_path, 'model_defaults: {outputs: {"0x10": {labels: l.txt}}}\n'))
    assert list(config.model_defaults.outputs) == ["0x10"]


def test_a_boolean_yaml_reads_where_text_goes_says_to_quote_it(tmp_path):
    """`host: true` (and `api_token: true`) said only that it must be a string (a tester, t84)."""
    with pytest.raises(ConfigError) as info:
        load_server_config(write(tmp_path, "host: true\n"))
    assert str(info.value).endswith("c.yaml: host: must be a non-empty string, got True (YAML reads it as a "
                                    "boolean: write it in quotes for text)"), str(info.value)


def test_a_host_in_brackets_is_refused_at_once_saying_to_drop_them(tmp_path):
    """`host: "[::1]"`, as a URL writes an IPv6 address, was refused only at the bind: "cannot
    listen on [[::1]]:8000: Name or service not known" (a configuration tester's finding)."""
    for host, write_instead in (("[::1]", "::1"), ("[::]:8000", ":: (and the port in port)")):
        said = f"host: an IPv6 address goes without brackets here: write {write_instead}, got '{host}'"
        with pytest.raises(ConfigError) as info:
            load_server_config(write(tmp_path, f'host: "{host}"\n'))
        assert str(info.value).endswith(said), str(info.value)
        with pytest.raises(ConfigError) as info:
            load_server_config(None, {"host": host})
        assert str(info.value) == said, str(info.value)
    assert load_server_config(write(tmp_path, 'host: "::1"\n')).host == "::1"
