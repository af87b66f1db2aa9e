"""The batch sizes ("gears") a compile makes when none are given, and the most it makes: here, not
in spec.py (which imports onnx), for the config's readers (config.pbtxt's max_batch_size)."""
DEFAULT_GEARS = (1, 2, 4, 8, 16, 32)
MAX_GEARS = 100
