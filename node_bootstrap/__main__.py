"""`python3 -m node_bootstrap`: see node_bootstrap.cli."""

import sys

from node_bootstrap.cli import main

sys.exit(main())
