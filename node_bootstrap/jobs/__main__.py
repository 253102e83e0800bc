"""`python3 -m node_bootstrap.jobs`: see node_bootstrap.jobs.cli. The SSM document and the supervisor
run it."""

import sys

from node_bootstrap.jobs.cli import main

sys.exit(main())
