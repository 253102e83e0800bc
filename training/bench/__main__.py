"""The entry point of ``python -m training.bench`` (the tool: __init__.py; its command line: cli.py)."""

import sys

from training.startup import frozen_imports

# Only ever run as the program: the imports (torch's, at cli's top) without the cycle collector, then frozen, so
# no collection in the timed steps walks them (training/startup.py). A test calling cli.main freezes nothing.
with frozen_imports():
    from training.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
