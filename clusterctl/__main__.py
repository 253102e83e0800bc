"""`python -m clusterctl`: the same as the `clusterctl` console script."""

import sys

from clusterctl.cli import main

sys.exit(main())
