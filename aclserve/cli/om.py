"""`aclserve compile` and `aclserve inspect`: the commands over the model files of om/.

Exit status: 0 success; 2 bad input (one line on stderr, via UsageError or argparse); 1 when ATC ran and failed,
the compile timed out (ATC's error lines quoted on one line) or failed otherwise (its process's error, one
line); 128 + the signal, as shells say it, when the compile's process or ATC was killed by one (137: SIGKILL,
the out-of-memory killer's) or this one ended by SIGTERM, SIGHUP or Ctrl-C; 141 or 74 when the OM was written
but stdout failed (cli/output.py).

The compile runs in a child process (om/compile_process.py, as the server's): a CPU compile spends
its test runs inside ONNX Runtime's C code, where the Python handler of SIGTERM and Ctrl-C never
ran, so an endless one could be ended only by SIGKILL, and `--timeout` could not bound it.
"""
from __future__ import annotations

import errno
import json

from ..om.compile_error import DEFAULT_TIMEOUT_S
from .output import print_err, print_out
from .usage import FILE_NAME, UsageError


def add_commands(sub) -> None:
    p = sub.add_parser("compile", help="compile an ONNX model to .om (ATC when available, else a CPU OM)",
                       description="Compile an ONNX model to an .om file: with Huawei's ATC when it is found "
                                   "(or --atc/--target npu), otherwise a CPU OM for the aclserve CPU runtime.")
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("-o", "--output", metavar="OUT.om", type=FILE_NAME, help="default: beside the model, with .om")
    p.add_argument("--input-shape", metavar="SHAPES", help='"name:-1,3,224,224;name2:..." (-1 = batch dimension)')
    p.add_argument("--batch", metavar="GEARS", help="batch sizes to compile, e.g. 1,2,4,8 "
                                                    "(default 1,2,4,8,16,32 for a dynamic-batch model)")
    p.add_argument("--soc-version", default=None, metavar="SOC",
                   help="ATC --soc_version (default: the SoC of this machine's NPU; ATC needs it without one, the "
                        "CPU compile does not)")
    p.add_argument("--precision-mode", default=None, metavar="MODE",
                   help="ATC --precision_mode, one of its values (default force_fp16; recorded but not applied by "
                        "the CPU runtime)")
    p.add_argument("--target", default="auto", type=str.lower, metavar="auto|npu|cpu",
                   help="auto: ATC if found, else CPU OM (default); npu: require ATC; cpu: CPU OM")
    p.add_argument("--atc", metavar="PATH", type=FILE_NAME, help="the ATC executable (default: `atc` on PATH)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="end the compile (ATC's or the CPU compile's test runs) after this many seconds "
                        f"(default {DEFAULT_TIMEOUT_S:g})")
    a = p.add_argument_group("AIPP (static; the OM then takes uint8 NHWC images)")
    a.add_argument("--aipp", metavar="FILE", type=FILE_NAME,
                   help="an AIPP config in ATC's aipp_op syntax (ATC --insert_op_conf)")
    a.add_argument("--image-input", metavar="[INPUT:]rgb|bgr|gray", action="append",
                   help="generate the AIPP config: the host sends uint8 pixels in this order to INPUT "
                        "(default the first input; bgr: the OM swaps R and B first); given once")
    a.add_argument("--mean", metavar="M[,M,M]",
                   help="with --image-input: per-channel mean, pixel units (0-255), in the order after the R/B "
                        "swap: R,G,B for bgr too, as ATC's AIPP normalises after it (reverse an OpenCV-style "
                        "B,G,R mean)")
    a.add_argument("--std", metavar="S[,S,S]",
                   help="with --image-input: per-channel std, pixel units, in --mean's order")
    p.set_defaults(func=run_compile)

    q = sub.add_parser("inspect", help="show what an .om file contains",
                       description="Show an .om file's header: everything for a CPU OM, the 256-byte "
                                   "header facts for an ATC OM.")
    q.add_argument("file", metavar="FILE.om")
    q.add_argument("--json", action="store_true", help="print the header as JSON")
    q.set_defaults(func=run_inspect)


def run_compile(args) -> int:
    # (onnx is the child's: what this process imports must not import it, --image-input NAME aside)
    from ..om import aipp
    from ..om.compile_error import AtcFailed, CompileError, check_timeout
    from ..om.compile_process import CompileKilled, CompileTimedOut, compile_in_child
    from ..om.describe import format_summary

    kwargs = {}
    if args.soc_version is not None:
        kwargs["soc_version"] = args.soc_version
    elif args.target != "cpu":
        from ..acl import device_soc_name  # only asks CANN when it is installed
        kwargs["soc_version"] = device_soc_name()
    if args.precision_mode is not None:
        kwargs["precision_mode"] = args.precision_mode
    timeout = DEFAULT_TIMEOUT_S if args.timeout is None else args.timeout
    try:
        check_timeout(timeout)  # (said before the child starts, as compile_model says it)
        ops = _aipp_ops(args)
    except CompileError as e:
        raise UsageError(str(e)) from None
    if ops:
        kwargs["aipp"] = aipp.render(ops)  # (what ATC is given; the child parses it back)
    try:
        result = compile_in_child(args.model, args.output, input_shape=args.input_shape, batch=args.batch,
                                  target=args.target, atc=args.atc, log=_progress, timeout_s=timeout, **kwargs)
    except CompileKilled as e:  # its process or ATC killed: not the input's fault (2), nor ATC's verdict (1)
        print_err(f"aclserve compile: error: {e}")
        return 128 + e.signum
    except (AtcFailed, CompileTimedOut) as e:
        print_err(f"aclserve compile: error: {e}")
        return 1
    except CompileError as e:
        raise UsageError(str(e)) from None
    except OSError as e:  # e.g. the output is a folder, or its folder is read-only
        if e.errno in (errno.ENOSPC, errno.EDQUOT):  # (the host short of disk, not bad input: 1, as out of memory)
            print_err(f"aclserve compile: error: cannot write {e.filename or args.output}: {e.strerror}")
            return 1
        raise UsageError(f"cannot write {e.filename2 or e.filename or args.output}: {e.strerror or e}") from None
    except (RuntimeError, MemoryError) as e:  # the child's unexpected error (_rebuilt), or the host short of memory
        print_err(f"aclserve compile: error: the compile failed: {e or 'out of host memory (MemoryError)'}")
        return 1
    print_out(format_summary(result), flush=True)
    return 0


def _aipp_ops(args):
    """--aipp FILE or --image-input/--mean/--std -> AippOps (None without either)."""
    from ..om import aipp
    from ..om.compile_error import CompileError

    if args.aipp and args.image_input:
        raise CompileError("give --aipp FILE or --image-input, not both")
    if (args.mean or args.std) and not args.image_input:
        raise CompileError("--mean/--std go with --image-input (an --aipp file carries its own values)")
    if args.aipp:
        try:
            with open(args.aipp, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise CompileError(f"--aipp {args.aipp}: {getattr(e, 'strerror', None) or e}") from None
        return aipp.parse(text, args.aipp)
    if not args.image_input:
        return None
    if len(args.image_input) > 1:  # (one --mean/--std could not say whose they are)
        raise CompileError("--image-input is given once; for several image inputs write an --aipp file "
                           "with an aipp_op per input")
    name, _, colour = args.image_input[0].rpartition(":")
    rank = 0
    if name:
        from ..om.spec import graph_inputs, load_onnx  # (imports onnx: the input's rank is known here)
        names = [i.name for i in graph_inputs(load_onnx(args.model, weights=False))]
        if name not in names:
            raise CompileError(f"--image-input names unknown input {name!r} (model inputs: "
                               f"{', '.join(map(repr, names))})")  # (quoted: a name's blanks show)
        rank = names.index(name)
    op = aipp.generate(colour, args.mean, args.std, rank)
    means, reciprocals = op.min_chn[:op.channels], op.var_reci_chn[:op.channels]
    warning = aipp.unit_scale_warning(args.mean and means, args.std and [1 / r for r in reciprocals])
    if warning:
        _progress(f"warning: --mean/--std: {warning}")
    return [op]


def _progress(line: str) -> None:
    print_out(line, flush=True)


def run_inspect(args) -> int:
    from ..om.describe import InspectError, describe, format_text

    try:
        info = describe(args.file)
    except InspectError as e:
        raise UsageError(str(e)) from None
    try:
        text = json.dumps(info, indent=2, sort_keys=True) if args.json else format_text(info)
    except (KeyError, TypeError, AttributeError, ValueError) as e:  # a field of another shape than written
        raise UsageError(f"{args.file}: the OM header is malformed ({type(e).__name__}: {e}); "
                         "aclserve serve refuses it too") from None
    print_out(text)
    return 0
