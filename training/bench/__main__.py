"""The entry point of ``python -m training.bench`` (the tool: __init__.py; its command line: cli.py)."""

import sys

from training.startup import frozen_imports

with frozen_imports():  # only ever run as the program: python -m training.bench
    from training.bench.cli import main

if __name__ == "__main__":
    sys.exit(main(freeze_imports=True))
