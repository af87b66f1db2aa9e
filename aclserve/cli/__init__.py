"""`aclserve serve|infer|profile|compile|inspect`: one argparse front door, the top layer.

Each command module of this package (serve, infer, profile, om) exposes `add_commands(subparsers)`,
registering parsers whose `func(args) -> int` does the work; they may import any layer below,
and nothing below imports them. Usage errors (usage.UsageError) exit with status 2 and one line
on stderr.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from .. import logs, startup_signals
from .._version import __version__
from .output import print_err, stdout_status
from .standard_fds import reopen_closed
from .termination import end_on_termination
from .usage import UsageError

DESCRIPTION = ("Serve Huawei Ascend .om models (compiled from ONNX by ATC) over the KServe v2 / Open "
               "Inference Protocol, on an NPU through pyACL or, without one, on the CPU runtime. "
               "Start with `aclserve serve` (serves ./models on http://127.0.0.1:8000).")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aclserve", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"aclserve {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    from . import infer, om, profile, serve

    for commands in (serve, infer, profile, om):
        commands.add_commands(sub)
    # usage errors in one line, as UsageError's, saying where the help is
    _one_line_errors(parser, "`aclserve --help` says what each does", commands=tuple(sub.choices))
    for command in sub.choices.values():
        _one_line_errors(command, f"`{command.prog} --help` lists its arguments")
        command.set_defaults(command_parser=command)  # (main has it report the command's unknown options)
    return parser


def _one_line_errors(parser: argparse.ArgumentParser, hint: str, commands: tuple[str, ...] = ()) -> None:
    """argparse prints the usage block before its error; keep it to the single error line, with
    `hint` (what to run for help) in place of the block, and the `commands` when the error does
    not list them: a bare `aclserve` said only "the following arguments are required: COMMAND"."""

    def error(message: str):
        said = hint
        if commands and not all(repr(name) in message for name in commands):  # (an invalid choice lists them)
            said = f"{', '.join(commands[:-1])} or {commands[-1]}; {hint}"
        parser.exit(2, f"{parser.prog}: error: {message} ({said})\n")

    parser.error = error  # type: ignore[method-assign]


# Options whose value may start with a minus sign: argparse reads `--mean -1,0,0` as an option
# followed by another option unless the value is joined to it (`--mean=-1,0,0`). `--batch -1,2`
# got "expected one argument"; joined, the compile says what is wrong with the sizes.
SIGNED_VALUES = ("--mean", "--std", "--batch")


# the commands other than serve (which logs it) reading ACLSERVE_* variables: each warns of one none reads
SAY_UNKNOWN_ENVIRONMENT = ("infer", "profile", "compile")


def join_signed_values(argv: list[str]) -> list[str]:
    """`--mean -1,0,0` as `--mean=-1,0,0`, so a negative first value reaches the option."""
    joined: list[str] = []
    for arg in argv:
        negative = len(arg) > 1 and arg[0] == "-" and (arg[1].isdigit() or arg[1] == ".")
        if negative and joined and joined[-1] in SIGNED_VALUES:
            joined[-1] = f"{joined[-1]}={arg}"
        else:
            joined.append(arg)
    return joined


def _spelt_with_hyphens(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    """'; did you mean --input-shape?' for an unknown `--input_shape` (ATC's spelling, and
    CANN's other tools') where the command has the option spelt with hyphens."""
    options = {option for action in parser._actions for option in action.option_strings}
    for arg in unknown:
        flag = arg.split("=", 1)[0]
        hyphens = flag.replace("_", "-")
        if flag.startswith("--") and hyphens != flag and hyphens in options:
            return f"; did you mean {hyphens}?"
    return ""


def main(argv: list[str] | None = None) -> int:
    reopen_closed()  # before anything opens a file: a closed 0-2 taken by one aborted serve (standard_fds.py)
    argv = sys.argv[1:] if argv is None else list(argv)
    serving = argv[:1] == ["serve"]
    if serving:  # (`python -m aclserve serve` records from its first line: __main__.py)
        startup_signals.record()  # a stop during its start-up is honoured by the start-up
    try:
        return _main(argv)
    finally:
        if serving:
            startup_signals.release()  # (unless serve's loop took the signals over: it did, or exited)


def _main(argv: list[str]) -> int:
    try:  # building the parser imports the commands (numpy: ~0.1 s), where a Ctrl-C was a traceback
        parser = build_parser()
    except KeyboardInterrupt:
        return 130
    args, unknown = parser.parse_known_args(join_signed_values(argv))
    if unknown:  # said by the command's parser (argparse has the top one say it, naming no command)
        parser = args.command_parser
        parser.error(f"unrecognized arguments: {' '.join(unknown)}{_spelt_with_hyphens(parser, unknown)}")
    if args.command in SAY_UNKNOWN_ENVIRONMENT:
        from .environment import say_unknown
        say_unknown(args.command)
    # (serve drains on these signals: its loop handles them)
    received: list[int] = []
    replaced = end_on_termination(received) if args.command != "serve" else {}
    status = _run_command(args, received, replaced)
    if args.command == "serve":
        from .serve import end_if_work_abandoned
        end_if_work_abandoned(status)  # (its error line, if any, is out: written above)
    return status


def _run_command(args, received: list[int], replaced: dict) -> int:
    """The command's status; a usage error said in one line, an interrupt as its status."""
    try:
        return stdout_status(args.command, int(args.func(args) or 0))
    except UsageError as e:
        said = f"aclserve {args.command}: error: {e}"
        if logs.writes_json():  # (serve --log-format json: the reason it stopped, as a JSON line too)
            logging.getLogger("aclserve").critical(said)
        else:
            print_err(said)
        return 2
    except KeyboardInterrupt:
        return 128 + received[-1] if received else 130
    finally:
        for sig, handler in replaced.items():  # (main() called in-process, by the tests say)
            signal.signal(sig, handler)
