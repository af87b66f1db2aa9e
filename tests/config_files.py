"""Config files the config tests write (tests/test_config*.py)."""
from __future__ import annotations

from pathlib import Path


def write(tmp_path, text: str, name="c.yaml") -> Path:
    """`text` as the file `name` in tmp_path: its path."""
    path = tmp_path / name
    path.write_text(text)
    return path
