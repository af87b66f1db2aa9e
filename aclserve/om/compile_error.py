"""CompileError, apart from the compiler's modules: the server raises it for a compile run in a
child process (compile_process.py) without importing onnx itself."""
from __future__ import annotations


class CompileError(ValueError):
    """Bad compile input or a failed build; the message is one line naming the problem."""
