"""The numbers ATC reads in a compile's options (--batch, an AIPP config's values), apart from
spec.py so that reading an AIPP config imports no onnx (`aclserve compile` reads it before its
child compiles)."""
from __future__ import annotations


def plain_number(text: str, integer: bool = False):
    """int() or float() of `text`, refusing (ValueError) what they take and ATC does not: 1_0
    (read as 10) and other scripts' digits. For --batch and the AIPP numbers alike."""
    if not text.isascii() or "_" in text:
        raise ValueError(text)
    return int(text) if integer else float(text)
