"""``python -m bench.replay``: the replay's command line (`bench.replay.cli`)."""
from bench.replay.cli import main

raise SystemExit(main())
