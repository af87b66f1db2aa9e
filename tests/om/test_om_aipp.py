"""Static AIPP at compile time: config parsing and refusals, the CPU OM's emulation against
host-side normalisation (run through the pyACL API on the CPU runtime), ATC's argv with
--insert_op_conf via the stand-in atc, and inspect."""
from __future__ import annotations

import json
import os

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from aclserve.acl import constants as C
from aclserve.om import aipp
from aclserve.om.compile import compile_model
from aclserve.om.describe import aipp_lines
from aclserve.om.spec import CompileError
from tests import tiny_models
from tests.tiny_models import MEAN, STD

from .acl_runner import acl_context, cpu_acl, run_batch
from .conftest import run_cli


@pytest.fixture
def conv_onnx(tmp_path) -> str:
    return tiny_models.conv_onnx(tmp_path / "conv.onnx")


def reference(onnx_path: str, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def device_aipp(pixels: np.ndarray, mean, min_, var) -> np.ndarray:
    """What the AIPP hardware makes of uint8 NHWC pixels, channel by channel (last axis):
    (half(p - mean_chn) - half(min_chn)) * half(var_reci_chn), each step in fp16 (hicann/ops-cv
    image/aipp/op_kernel/arch35/aipp_base.h DataConversion); returned as float32 NHWC."""
    h = np.float16
    centred = (pixels.astype(np.int32) - np.asarray(mean, np.int32)).astype(h)
    return ((centred - np.asarray(min_, np.float32).astype(h)) * np.asarray(var, np.float32).astype(h)).astype(np.float32)


def run_om(path: str, image: np.ndarray, batch: int | None) -> np.ndarray:
    acl = cpu_acl()
    with acl_context(acl):
        return run_batch(acl, path, {"x": image}, batch)["y"]


@pytest.mark.parametrize("colour", ["rgb", "bgr"])
def test_aipp_cpu_om_equals_host_normalisation(tmp_path, conv_onnx, colour):
    ops = [aipp.generate(colour, ",".join(map(str, MEAN)), ",".join(map(str, STD)))]
    out = compile_model(conv_onnx, tmp_path / "a.om", batch="1,2,4", target="cpu", aipp=ops, log=lambda s: None)
    x_in = out.header["inputs"][0]
    assert (x_in["datatype"], x_in["dims"], x_in["format"]) == ("UINT8", [-1, 16, 16, 3], "NHWC")
    image = np.random.default_rng(7).integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)
    got = run_om(str(out.path), image, 4)
    rgb = image[..., ::-1] if colour == "bgr" else image
    host = device_aipp(rgb, 0, MEAN, 1 / STD).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got, reference(conv_onnx, np.ascontiguousarray(host)), rtol=1e-5, atol=1e-4)
    plain = ((rgb.astype(np.float32) - MEAN) / STD).transpose(0, 3, 1, 2)  # float32 host normalisation: near
    np.testing.assert_allclose(got, reference(conv_onnx, np.ascontiguousarray(plain)), atol=0.05)


def test_the_colour_order_is_taken_in_any_case():
    """--image-input RGB was "must be rgb, bgr or gray, got 'RGB'"."""
    assert aipp.generate("RGB", "1,2,3") == aipp.generate("rgb", "1,2,3")
    assert aipp.generate("Gray") == aipp.generate("gray")


def test_om_descriptor_reports_uint8_nhwc_and_image_size(tmp_path, conv_onnx):
    ops = [aipp.generate("rgb")]
    path = str(compile_model(conv_onnx, tmp_path / "a.om", batch="1,2", target="cpu", aipp=ops,
                             log=lambda s: None).path)
    acl = cpu_acl()
    with acl_context(acl):
        model_id, ret = acl.mdl.load_from_file(path)
        assert ret == 0
        desc = acl.mdl.create_desc()
        assert acl.mdl.get_desc(desc, model_id) == 0
        assert acl.mdl.get_input_data_type(desc, 0) == C.ACL_UINT8
        assert acl.mdl.get_input_format(desc, 0) == C.ACL_FORMAT_NHWC
        assert acl.mdl.get_input_size_by_index(desc, 0) == 2 * 16 * 16 * 3  # largest gear, one byte a pixel
        acl.mdl.destroy_desc(desc)
        assert acl.mdl.unload(model_id) == 0


@pytest.mark.parametrize("top, bottom, left, right", [(1, 1, 2, 2), (3, 1, 1, 4)], ids=["even", "uneven"])
def test_crop_padding_and_grey_match_numpy(tmp_path, top, bottom, left, right):
    """Grey 20x18 source, cropped at (3, 2) to what the padding makes 16x16, padded with 0.5. Uneven
    padding tells each side's size from its opposite's (top and bottom swapped went unseen)."""
    src = tiny_models.conv_onnx(tmp_path / "g.onnx", channels=1, side=16)
    crop_h, crop_w = 16 - top - bottom, 16 - left - right
    text = f"""
    aipp_op {{
      aipp_mode: static
      input_format: YUV400_U8
      src_image_size_w: 20
      src_image_size_h: 18
      crop: true
      load_start_pos_w: 3
      load_start_pos_h: 2
      crop_size_w: {crop_w}
      crop_size_h: {crop_h}
      padding: true
      left_padding_size: {left}
      right_padding_size: {right}
      top_padding_size: {top}
      bottom_padding_size: {bottom}
      padding_value: 0.5
      mean_chn_0: 100
      min_chn_0: 0.5
      var_reci_chn_0: 0.01
    }}"""
    ops = aipp.parse(text)
    out = compile_model(src, tmp_path / "g.om", batch="1", target="cpu", aipp=ops, log=lambda s: None)
    assert out.header["inputs"][0]["dims"] == [1, 18, 20, 1]
    image = np.random.default_rng(2).integers(0, 256, (1, 18, 20, 1), dtype=np.uint8)
    got = run_om(str(out.path), image, None)
    norm = device_aipp(image[:, 2:2 + crop_h, 3:3 + crop_w, :], 100, 0.5, 0.01).transpose(0, 3, 1, 2)
    host = np.pad(norm, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=0.5)
    np.testing.assert_allclose(got, reference(src, host), rtol=1e-5, atol=1e-5)


def test_inspect_calls_a_grey_aipp_grey_whatever_its_swap(tmp_path):
    """A YUV400 AIPP with rbuv_swap_switch true (nothing to swap in one channel; the server takes
    it as grey) was shown as "YUV400_U8 (BGR)" (an independent tester)."""
    src = tiny_models.conv_onnx(tmp_path / "g.onnx", channels=1, side=16)
    ops = aipp.parse("aipp_op {\n aipp_mode: static\n input_format: YUV400_U8\n rbuv_swap_switch: true\n}")
    out = compile_model(src, tmp_path / "g.om", batch="1", target="cpu", aipp=ops, log=lambda s: None)
    assert aipp_lines(out.header)[0].startswith("aipp on x: static, YUV400_U8 (grey), source 16x16")


def test_first_aipp_info_reports_the_static_aipp_of_an_input(tmp_path):
    """acl.mdl.get_first_aipp_info as pyACL returns it: (dict keyed like aclAippInfo, 0), or
    (None, 145015) for an input without static AIPP (the gear input, a model without AIPP)."""
    src = tiny_models.conv_onnx(tmp_path / "c.onnx")
    text = ("aipp_op { aipp_mode: static input_format: RGB888_U8 rbuv_swap_switch: true src_image_size_w: 20 "
            "src_image_size_h: 18 crop: true load_start_pos_w: 4 load_start_pos_h: 2 crop_size_w: 16 "
            "crop_size_h: 16 mean_chn_0: 10 min_chn_1: 0.5 var_reci_chn_2: 0.1 }")
    with_aipp = compile_model(src, tmp_path / "a.om", batch="1,2", target="cpu", aipp=aipp.parse(text),
                              log=lambda s: None).path
    plain = compile_model(src, tmp_path / "p.om", batch="1,2", target="cpu", log=lambda s: None).path
    acl = cpu_acl()
    with acl_context(acl):
        model_id, ret = acl.mdl.load_from_file(str(with_aipp))
        info, ret = acl.mdl.get_first_aipp_info(model_id, 0)
        assert ret == 0
        assert (info["inputFormat"], info["rbuvSwapSwitch"], info["srcImageSizeW"], info["srcImageSizeH"]) == \
            (C.ACL_RGB888_U8, 1, 20, 18)
        assert (info["cropSwitch"], info["loadStartPosW"], info["loadStartPosH"], info["cropSizeW"]) == (1, 4, 2, 16)
        assert (info["meanChn0"], info["minChn1"], info["varReciChn0"]) == (10, 0.5, 1.0)
        assert info["varReciChn2"] == np.float32(0.1)  # a C float, as pyACL builds it
        assert acl.mdl.get_first_aipp_info(model_id, 1) == (None, C.ACL_ERROR_GE_AIPP_NOT_EXIST)  # the gears'
        other, ret = acl.mdl.load_from_file(str(plain))
        assert acl.mdl.get_first_aipp_info(other, 0) == (None, C.ACL_ERROR_GE_AIPP_NOT_EXIST)
        assert acl.mdl.get_first_aipp_info(999, 0) == (None, C.ACL_ERROR_GE_EXEC_MODEL_ID_INVALID)
        with pytest.raises(TypeError, match="args parse failed"):
            acl.mdl.get_first_aipp_info(model_id, np.int64(0))  # "k": a numpy int is refused
        assert acl.mdl.unload(model_id) == 0 and acl.mdl.unload(other) == 0


def test_a_header_whose_aipp_entry_is_not_one_is_refused_at_load(tmp_path):
    """get_first_aipp_info reads what the load built from the header: an entry it cannot read
    refuses the load (145006, as a malformed OM), and never raises from the call later."""
    from aclserve.om import container
    src = tiny_models.conv_onnx(tmp_path / "c.onnx")
    path = compile_model(src, tmp_path / "a.om", batch="1,2", target="cpu", aipp=[aipp.generate("rgb")],
                         log=lambda s: None).path
    om = container.read(path)
    del om.header["aipp"][0]["image_input"]
    del om.header["payload_sha256"]  # written anew
    container.write(tmp_path / "bad.om", om.header, om.payload)
    acl = cpu_acl()
    with acl_context(acl):
        assert acl.mdl.load_from_file(str(tmp_path / "bad.om")) == (0, C.ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID)


def identity_onnx(path, channels: int, h: int, w: int) -> str:
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "id",
                              [vi("x", TensorProto.FLOAT, [1, channels, h, w])],
                              [vi("y", TensorProto.FLOAT, [1, channels, h, w])])
    return tiny_models.save_graph(graph, path)


def test_aipp_output_is_the_devices_fp16_arithmetic(tmp_path):
    """Every pixel value through ImageNet AIPP gives exactly the fp16 result the device computes
    (min/var_reci held as fp16, each step rounded), not float32 (which is up to 2.8e-3 off), and the
    padding is padding_value as an fp16."""
    src = identity_onnx(tmp_path / "id.onnx", 3, 18, 16)
    text = """aipp_op {
      aipp_mode: static
      input_format: RGB888_U8
      src_image_size_w: 16
      src_image_size_h: 16
      padding: true
      top_padding_size: 1
      bottom_padding_size: 1
      padding_value: 0.1
      mean_chn_0: 3
      min_chn_0: 120.675  min_chn_1: 116.28  min_chn_2: 103.53
      var_reci_chn_0: 0.0171247538  var_reci_chn_1: 0.0175070028  var_reci_chn_2: 0.0174291939
    }"""
    out = compile_model(src, tmp_path / "id.om", target="cpu", aipp=aipp.parse(text), log=lambda s: None)
    image = np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1).repeat(3, axis=3)
    got = run_om(str(out.path), image, None)
    want = device_aipp(image, [3, 0, 0], [120.675, 116.28, 103.53], [0.0171247538, 0.0175070028, 0.0174291939])
    np.testing.assert_array_equal(got[:, :, 1:17], want.transpose(0, 3, 1, 2))
    assert got[0, 0, 0, 0] == np.float32(np.float16(0.1)) and got[0, 2, 17, 15] == np.float32(np.float16(0.1))


def test_a_bgr_image_input_takes_its_mean_r_g_b_and_the_help_says_so(tmp_path):
    """ATC's AIPP normalises after its R/B swap, so with --image-input bgr --mean and --std are
    R,G,B. The help said "per-channel" beside "the host sends uint8 pixels in this order", and an
    OpenCV-style B,G,R mean swapped R's and B's normalisation unsaid (an independent tester)."""
    src = identity_onnx(tmp_path / "id.onnx", 3, 2, 2)
    out = compile_model(src, tmp_path / "id.om", target="cpu", aipp=[aipp.generate("bgr", "10,20,30")],
                        log=lambda s: None)
    bgr = np.full((1, 2, 2, 3), 100, np.uint8)
    assert run_om(str(out.path), bgr, None)[0, :, 0, 0].tolist() == [90, 80, 70]  # R - 10, G - 20, B - 30
    helped = " ".join(run_cli("compile", "--help").stdout.split())
    assert "in the order after the R/B swap: R,G,B for bgr too" in helped and "OpenCV-style B,G,R mean" in helped
    assert "std, pixel units, in --mean's order" in helped


def test_atc_gets_insert_op_conf_and_the_nchw_shape(tmp_path, fake_atc, conv_onnx):
    atc, record = fake_atc
    ops = [aipp.generate("bgr", "123.675,116.28,103.53", "58.395,57.12,57.375")]
    result = compile_model(conv_onnx, tmp_path / "n.om", batch="1,2", soc_version="Ascend310P3", atc=str(atc),
                           aipp=ops, log=lambda s: None)
    rec = json.loads(record.read_text())
    argv = rec["argv"]
    conf = [a for a in argv if a.startswith("--insert_op_conf=")]
    assert len(conf) == 1 and os.path.isabs(conf[0].split("=", 1)[1])
    assert os.path.dirname(conf[0].split("=", 1)[1]) == rec["cwd"]  # in ATC's work folder
    assert "--input_shape=x:-1,3,16,16" in argv  # ATC takes the model's own NCHW shape
    assert aipp.parse(rec["insert_op_conf"]) == ops  # what ATC read is what the CPU OM emulates
    assert "rbuv_swap_switch: true" in rec["insert_op_conf"] and "aipp_mode: static" in rec["insert_op_conf"]
    assert result.header["inputs"][0]["datatype"] == "UINT8" and result.header["aipp"][0]["input"] == "x"


def test_cli_aipp_file_and_inspect(tmp_path, conv_onnx):
    cfg = tmp_path / "aipp.cfg"
    cfg.write_text(aipp.render([aipp.generate("rgb", "127.5", "127.5")]))
    out = tmp_path / "c.om"
    proc = run_cli("compile", conv_onnx, "-o", out, "--batch", "1,2", "--target", "cpu", "--aipp", cfg)
    assert proc.returncode == 0, proc.stderr
    assert "aipp on x: static, RGB888_U8 (RGB), source 16x16 uint8 NHWC" in proc.stdout
    shown = run_cli("inspect", out)
    assert "x: UINT8 [N,16,16,3] NHWC" in shown.stdout and "min_chn [127.5, 127.5, 127.5]" in shown.stdout
    info = json.loads(run_cli("inspect", out, "--json").stdout)
    assert info["header"]["aipp"][0]["var_reci_chn"] == [1 / 127.5] * 3


@pytest.mark.parametrize("body, message", [
    ("aipp_mode: dynamic\n max_src_image_size: 100", "dynamic AIPP is not supported"),
    ("aipp_mode: static\n input_format: YUV420SP_U8", "input_format YUV420SP_U8 is not supported"),
    ("aipp_mode: static\n csc_switch: true", "csc_switch"),
    ("aipp_mode: static\n resize: true", "resize is reserved"),
    ("input_format: RGB888_U8", "aipp_mode is required"),
    ("aipp_mode: static\n mean_chn_0: 300", "mean_chn_0 must be in [0, 255]"),
    ("aipp_mode: static\n colour: red", "unknown key 'colour'"),
    ("aipp_mode: static\n crop: maybe", "crop must be true or false"),
    ("aipp_mode: static\n mean_chn_0: 1_0", "mean_chn_0 must be an integer, got '1_0'"),  # int() read 10
    ("aipp_mode: static\n var_reci_chn_0: 0.0_1", "var_reci_chn_0 must be a number"),
    ("aipp_mode: static\n padding: true\n padding_value: 70000", "padding_value must be in [-65504, 65504]"),
    ("aipp_mode: static\n padding: true\n padding_value: nan", "padding_value must be in [-65504, 65504]"),
])
def test_refused_configs_say_why_in_one_line(body, message):
    with pytest.raises(CompileError, match=message.replace("[", r"\[").replace("]", r"\]")) as e:
        aipp.parse("aipp_op {\n " + body + "\n}")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("std, message", [
    ("nan,1,1", "finite numbers"), ("inf,1,1", "finite numbers"), ("1,x,1", "finite numbers"),
    ("1e-5,1,1", "at least 1/65504"), ("0,1,1", "at least 1/65504"),
    ("1_0,1,1", "finite numbers"), ("\u0661\u0662,1,1", "finite numbers"),  # float() read 10 and 12
])
def test_generated_std_must_be_finite_and_its_reciprocal_an_fp16(std, message):
    """--std nan (and inf) wrote an OM whose 1/std was nan (or 0); 1e-5 was 'must be non-zero'
    (found by an independent check)."""
    with pytest.raises(CompileError, match=message):
        aipp.generate("rgb", None, std)


def test_config_that_does_not_fit_the_model_is_refused(tmp_path, conv_onnx):
    cases = [(aipp.generate("gray"), "gives 1 channel"),
             (aipp.AippOp(src_image_size_w=20, src_image_size_h=16, crop=True, crop_size_w=10, crop_size_h=16),
              "produces 10x16"),
             (aipp.AippOp(related_input_rank=1), "related_input_rank 1")]
    for op, message in cases:
        with pytest.raises(CompileError, match=message):
            compile_model(conv_onnx, tmp_path / "x.om", target="cpu", aipp=[op], log=lambda s: None)
    assert not os.path.exists(tmp_path / "x.om")


def test_cli_takes_a_negative_first_value(tmp_path, conv_onnx):
    """argparse read `--mean -1,0,0` as an option missing its argument (found by an independent
    check): a value starting with a minus sign reaches --mean and --std, which judge it."""
    proc = run_cli("compile", conv_onnx, "-o", tmp_path / "m.om", "--target", "cpu", "--image-input", "rgb",
                   "--mean", "-1,0,0")
    assert proc.returncode == 2 and "--mean values must be in [0, 255]" in proc.stderr, proc.stderr
    proc = run_cli("compile", conv_onnx, "-o", tmp_path / "s.om", "--target", "cpu", "--image-input", "rgb",
                   "--std", "-1,1,1")  # ATC's var_reci_chn may be negative
    assert proc.returncode == 0 and os.path.exists(tmp_path / "s.om"), proc.stderr
    assert "warning" not in proc.stdout


def test_cli_warns_of_a_mean_and_std_in_torchvisions_units(tmp_path, conv_onnx):
    """--mean 0.485,.. --std 0.229,.. (torchvision's, for pixels scaled to 0-1) compile an OM that
    makes a white pixel 1,111, not 2.2: said, as pixel units are expected (the compile goes on)."""
    proc = run_cli("compile", conv_onnx, "-o", tmp_path / "t.om", "--target", "cpu", "--image-input", "rgb",
                   "--mean", "0.485,0.456,0.406", "--std", "0.229,0.224,0.225")
    assert proc.returncode == 0 and os.path.exists(tmp_path / "t.om"), proc.stderr
    assert ("warning: --mean/--std: mean and std are all below 1, as for pixels scaled to 0-1 (torchvision's "
            "Normalize), but they are in pixel units, 0-255: multiply them by 255") in proc.stdout, proc.stdout


def test_cli_refusals_are_one_line_exit_2(tmp_path, conv_onnx):
    cfg = tmp_path / "dyn.cfg"
    cfg.write_text("aipp_op {\n aipp_mode: dynamic\n max_src_image_size: 1000\n}\n")
    proc = run_cli("compile", conv_onnx, "-o", tmp_path / "d.om", "--target", "cpu", "--aipp", cfg)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "dynamic AIPP" in proc.stderr
    proc = run_cli("compile", conv_onnx, "-o", tmp_path / "d.om", "--target", "cpu", "--image-input", "rgb",
                   "--mean", "1,2")
    assert proc.returncode == 2 and "--mean needs 3 value(s)" in proc.stderr
    proc = run_cli("compile", conv_onnx, "-o", tmp_path / "d.om", "--target", "cpu", "--image-input", "y:rgb")
    assert proc.returncode == 2 and "unknown input 'y'" in proc.stderr
    proc = run_cli("compile", conv_onnx, "-o", tmp_path / "d.om", "--target", "cpu", "--image-input", "rgb",
                   "--image-input", "bgr")  # the second one was taken, the first dropped unsaid
    assert proc.returncode == 2 and "--image-input is given once" in proc.stderr and not os.path.exists(tmp_path / "d.om")


@pytest.mark.parametrize("h, w, message", [(8, 4097, "model's W 4097, which must be in [2, 4096]"),
                                           (4097, 8, "model's H 4097, which must be in [1, 4096]")])
def test_source_size_0_takes_the_models_size_within_atcs_range(tmp_path, h, w, message):
    """src_image_size_w/h 0 takes the model's W/H, which ATC then wants in [2, 4096] / [1, 4096]
    (config_file_template.md; TBE aipp_comm.py: "when src_image_size_w is 0 ... input_W of network
    should be within [2, 4096]"); the CPU compile built an OM taking a 4097-wide image."""
    src = identity_onnx(tmp_path / "wide.onnx", 1, h, w)
    with pytest.raises(CompileError, match=message.replace("[", r"\[").replace("]", r"\]")):
        compile_model(src, tmp_path / "wide.om", target="cpu", aipp=[aipp.generate("gray")], log=lambda s: None)
    assert not os.path.exists(tmp_path / "wide.om")


@pytest.mark.parametrize("soc, w, message", [
    ("Ascend310P3", 1082, "at most 1080 on Ascend310P3; the model input is 1082 wide"),
    (None, 4098, "at most 4096; the model input is 4098 wide"),
    ("Ascend910ProB", 1082, "at most 1080 on Ascend910ProB; the model input is 1082 wide"),
    ("Ascend910B1", 4098, "at most 4096; the model input is 4098 wide")])
def test_padded_output_width_is_within_the_socs_limit(tmp_path, soc, w, message):
    """With padding the AIPP output W is at most 1080 on Atlas inference (310P) and training (910)
    and at most 4096 on the others (config_file_template.md; TBE aipp_comm.py: "after padding, aipp
    output W[%d] should be less than or eaqual to 1080" on Ascend310/610/710); the CPU compile built
    such OMs."""
    src = identity_onnx(tmp_path / "wide.onnx", 1, 4, w)
    op = aipp.AippOp(input_format="YUV400_U8", src_image_size_w=w - 2, src_image_size_h=4, padding=True,
                     left_padding_size=1, right_padding_size=1)
    with pytest.raises(CompileError, match=message):
        compile_model(src, tmp_path / "wide.om", target="cpu", soc_version=soc, aipp=[op], log=lambda s: None)
    ok = identity_onnx(tmp_path / "ok.onnx", 1, 4, 1080)  # 1080 is allowed everywhere
    op = aipp.AippOp(input_format="YUV400_U8", src_image_size_w=1078, src_image_size_h=4, padding=True,
                     left_padding_size=1, right_padding_size=1)
    compile_model(ok, tmp_path / "ok.om", target="cpu", soc_version=soc, aipp=[op], log=lambda s: None)
