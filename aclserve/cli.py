"""`aclserve serve|compile|inspect|infer|profile`: one argparse front door; each package adds its commands.

Every command module exposes `add_commands(subparsers)`, registering parsers whose
`func(args) -> int` does the work. Usage errors exit with status 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys

from ._version import __version__

DESCRIPTION = ("Serve Huawei Ascend .om models (compiled from ONNX by ATC) over the KServe v2 / Open "
               "Inference Protocol, on an NPU through pyACL or, without one, on the CPU runtime. "
               "Start with `aclserve serve` (serves ./models on http://127.0.0.1:8000).")


class UsageError(Exception):
    """Bad input from the command line: printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aclserve", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"aclserve {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    from .om import cli as om_cli
    from .server import cli as server_cli

    server_cli.add_commands(sub)
    om_cli.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as e:
        print(f"aclserve {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `aclserve compile ... | head`: the reader left; no traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not fail again
        return 141


if __name__ == "__main__":
    sys.exit(main())
