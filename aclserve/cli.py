"""`aclserve serve|compile|inspect|infer`: one argparse front door; each package adds its commands.

Every command module exposes `add_commands(subparsers)`, registering parsers whose
`func(args) -> int` does the work. Usage errors exit with status 2 and one line on stderr.
"""
from __future__ import annotations

import argparse
import sys

from . import __version__


class UsageError(Exception):
    """Bad input from the command line: printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aclserve", description=__doc__.splitlines()[0])
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


if __name__ == "__main__":
    sys.exit(main())
