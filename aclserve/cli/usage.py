"""The one error a command raises for bad command-line input."""


class UsageError(Exception):
    """Bad input from the command line: printed as one line, exit status 2."""
