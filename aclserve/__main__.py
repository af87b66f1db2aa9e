import sys

if sys.argv[1:2] == ["serve"]:  # a stop signal from here on is recorded for its start-up to honour
    from .startup_signals import record
    record()

from .cli import main  # noqa: E402

sys.exit(main())
