"""What the commands say when something is wrong: one line each."""


class UsageError(Exception):
    """Bad input from the command line: printed as one line, exit status 2."""


class NotKServe(ValueError):
    """The URL answered, but not as a KServe v2 HTTP server (a gRPC port, HTML...)."""


def one_line(text) -> str:
    """The first line of an answer or an error, printable (a gRPC port answers binary frames)."""
    lines = str(text).strip().splitlines() or [""]
    return "".join(c if c.isprintable() else "?" for c in lines[0][:200])
