"""The entry point of ``python -m training.bench`` (the tool: __init__.py; its command line: cli.py)."""

import sys

from training.bench.cli import main

if __name__ == "__main__":
    sys.exit(main(freeze_imports=True))
