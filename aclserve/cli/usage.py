"""What the commands say when something is wrong: one line each."""

import argparse

from ..quoting import listed_names


# what a reply that is not HTTP/1.1 most likely means (said by one_line and `aclserve profile`)
NOT_HTTP1_HINT = "(an HTTP/2 or gRPC port?)"


class UsageError(Exception):
    """Bad input from the command line: printed as one line, exit status 2."""


def _named_path(what: str):
    """An argparse `type` for an option naming `what` ("a file"): an empty value (`--tls-cert ''`,
    an unset shell variable) was taken as the option not given (TLS off, a default file written, no
    AIPP) without a word; argparse refuses it in one line, as a bad value of any option."""
    def named(value: str) -> str:
        if not value:
            raise argparse.ArgumentTypeError(f"needs {what} name, got ''")
        return value
    return named


# every option of the commands naming a file or a folder takes its value through one of these
FILE_NAME = _named_path("a file")
FOLDER_NAME = _named_path("a folder")


class NotKServe(ValueError):
    """The URL answered, but not as a KServe v2 HTTP server (a gRPC port, HTML...)."""


def one_line(text) -> str:
    """The first line of an answer or an error, printable: one that is mostly not text is said to
    be binary (a gRPC port answers HTTP/2 frames: "??????ÿÿ????@?þ" was printed)."""
    lines = str(text).strip().splitlines() or [""]
    line = lines[0][:200].replace("\t", " ")
    unprintable = sum(not c.isprintable() and c != "\x1b" for c in line)  # (ESC: a coloured message)
    if unprintable and unprintable * 10 >= len(line):
        return f"binary data, not HTTP/1.1 text {NOT_HTTP1_HINT}"
    return "".join(c if c.isprintable() else "?" for c in line)


MODELS_LISTED = 20  # past these a hint says how many more


def models_hint(names, which: str = "ready") -> str:
    """' (models ready: a, b)': what to name instead of a model the server does not know; `which`
    says what the names are ("in the models folder": `profile` in-process, which loads one)."""
    names = sorted(set(names))
    if not names:
        return f" (no model is {which})"
    return f" (models {which}: {listed_names(names, MODELS_LISTED)})"
