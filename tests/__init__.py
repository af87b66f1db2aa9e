"""aclserve's test suite. Shared fixtures: conftest.py; shared helpers tests import by name:
tiny_models.py (ONNX models built in code, compiled to CPU OMs), serving.py (real servers) and
processes.py (the processes a tool under test started)."""
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent  # the repository root: models/, tools/, tests/data/
