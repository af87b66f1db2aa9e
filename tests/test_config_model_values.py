"""Model settings refused as the file is read, not when a model loads: an image mean or std no
picture could take, an integer input's value_range, a compile option ATC would refuse."""
from __future__ import annotations

import re

import pytest

from aclserve.config import ConfigError, ModelConfig, load_model_config, load_server_config
from tests.config_files import write


CHANNELS = "a picture has 1 channel (gray) or 3 (rgb, bgr), so give 1 value (for every channel) or 3 (one per channel)"


@pytest.mark.parametrize("image, said", [
    ("{mean: [1, 2]}", "{file}: model_defaults.inputs.x.image.mean: has 2 values: " + CHANNELS),
    ("{std: [50, 50, 50, 50]}", "{file}: model_defaults.inputs.x.image.std: has 4 values: " + CHANNELS),
    ("{color: gray, mean: [1, 2, 3]}", "model_defaults.inputs.x.image.mean: has 3 values for color gray, which has "
     "1 channel: give 1 (model_defaults.inputs.x.image.color from {file}, model_defaults.inputs.x.image.mean from "
     "{file})"),
    ("{std: 1.0e-39}", "model_defaults.inputs.x.image.std: with std [1e-39], pixels 0-255 become values up to "
     "2.55e+41 in size, beyond FP32's largest, 3.40282e+38, that of every input an image may feed; mean and std are "
     "in pixel units, 0-255 (model_defaults.inputs.x.image.std from {file})"),
])
def test_an_image_mean_or_std_no_model_could_take_is_refused_when_the_config_is_read(tmp_path, image, said):
    """model_defaults' `mean: [1, 2]` (every picture has 1 or 3 channels) was taken, then passed
    over model by model as each loaded (found in review): what no model input could take is
    refused with the server config, naming it and where it came from."""
    path = write(tmp_path, f"model_defaults:\n  inputs:\n    x: {{image: {image}}}\n")
    with pytest.raises(ConfigError) as info:
        load_server_config(path)
    assert str(info.value) == said.format(file=path)


def test_a_models_image_mean_no_model_could_take_is_refused_as_its_file_is_read(tmp_path):
    """The same in a model's file, whose values may meet model_defaults': each named by its origin."""
    server = write(tmp_path, "model_defaults:\n  inputs:\n    x: {image: {mean: [1, 2, 3]}}\n", "s.yaml")
    defaults = load_server_config(server)
    for text, said in (("inputs: {y: {image: {std: [1, 2]}}}",
                        "{model}: inputs.y.image.std: has 2 values: " + CHANNELS),
                       ("inputs: {x: {image: {color: gray}}}", "inputs.x.image.mean: has 3 values for color gray, "
                        "which has 1 channel: give 1 (inputs.x.image.color from {model}, inputs.x.image.mean from "
                        "the server config's model_defaults ({server}))")):
        model = write(tmp_path, text + "\n", "m.yaml")
        with pytest.raises(ConfigError) as info:
            load_model_config(model, defaults.model_defaults)
        assert str(info.value) == said.format(model=model, server=server)


def test_an_integer_inputs_value_range_is_two_integers_smallest_first(tmp_path):
    defaults = load_server_config(None, {"model_defaults.inputs": {"n": {"value_range": [0, 5]}}}).model_defaults
    assert defaults.inputs["n"].value_range == (0, 5)
    config = load_model_config(write(tmp_path, "inputs: {n: {value_range: [-3, 3]}}\n", "m.yaml"), defaults)
    assert config.inputs["n"].value_range == (-3, 3)  # the model's own replaces the default's
    for text, problem in [("[1]", "must be [smallest, largest], two integers, got [1]"),
                          ("[0, 2.5]", "inputs.n.value_range[1]: must be an integer, got 2.5"),
                          ("[4, 3]", "smallest 4 is above largest 3"),
                          ("7", "must be [smallest, largest], two integers, got 7")]:
        with pytest.raises(ConfigError, match=re.escape(problem)):
            load_model_config(write(tmp_path, f"inputs: {{n: {{value_range: {text}}}}}\n", "m.yaml"), defaults)
    with pytest.raises(ConfigError, match="set image or value_range, not both"):
        load_model_config(write(tmp_path, "inputs: {n: {value_range: [0, 1], image: {color: gray}}}\n", "m.yaml"),
                          defaults)


def test_a_models_bad_compile_option_is_refused_as_its_file_is_read(tmp_path):
    """A model's own compile.precision_mode or input_shape that ATC would refuse is that file's error,
    as its other keys' are (it was found only at the model's compile)."""
    for text, said in (("compile: {precision_mode: bogus}", "compile.precision_mode: 'bogus' is not one ATC takes"),
                       ("compile: {input_shape: 'x:-2'}", "compile.input_shape: malformed entry 'x:-2': dims must be "
                        "positive or -1")):
        path = write(tmp_path, text + "\n", "m.yaml")
        with pytest.raises(ConfigError) as info:
            load_model_config(path, ModelConfig())
        assert str(info.value).startswith(f"{path}: {said}")
    assert load_model_config(write(tmp_path, "compile: {precision_mode: force_fp32, input_shape: 'x:-1,8'}\n",
                                   "m.yaml"), ModelConfig()).compile.precision_mode == "force_fp32"
    # a named choice in any case (README "Configuration"), kept as ATC writes it
    assert load_model_config(write(tmp_path, "compile: {precision_mode: FORCE_FP32}\n", "m.yaml"),
                             ModelConfig()).compile.precision_mode == "force_fp32"
