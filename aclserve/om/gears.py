"""The batch sizes ("gears") a compile makes when none are given, and the most it makes: here, not
in spec.py (which imports onnx), for the config's readers (config.pbtxt's max_batch_size)."""
DEFAULT_GEARS = (1, 2, 4, 8, 16, 32)
MAX_GEARS = 100
# the largest batch size compiled: ATC's page "--dynamic_batch_size" limits each size to 1..2048 (as
# advice: its code checks none, and warns that large sizes may fail the compile). Past it a size went
# to the compile unchecked, whose CPU test run of a static one allocated its rows first (100,000,000
# of 64 FP32 values: 23.8 GiB, refused by numpy; a size the host's memory holds was allocated)
MAX_BATCH_SIZE = 2048
MAX_BATCH_SIZE_WHY = "the largest ATC documents for --dynamic_batch_size"  # (as a refusal says it)
