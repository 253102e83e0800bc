"""Whether the metadata block holds when a job starts (issue 42): `start` runs the health monitor's check
`imds-block` (imds_block.py: node_bootstrap/metadata_probe.py as the job user; only the block's REJECT
passes) and, while it fails, refuses in one line before any path is touched. A job user that can reach the
instance metadata service can take the node role's credentials; the monitor finds the same within a round
(monitor.intervalSeconds), and this check closes that window for the job about to start.

The finding is recorded in the monitor's state (monitor/state.py) as a round records its own, so the next
round does the responses (stop the job, tag, log, SetInstanceHealth Unhealthy) once, and the node stays
unhealthy until it is replaced.

The probe runs with the system interpreter and the bundle's script, both under the node root (a test's fake
root holds a stand-in interpreter that answers as its firewall would: tests/node_fake_firewall.py).
"""

from __future__ import annotations

import os

from node_bootstrap.checks import FAIL
from node_bootstrap.host import Host
from node_bootstrap.imds_block import CHECK, MetadataProbe, check_metadata_blocked
from node_bootstrap.jobs.errors import JobError
from node_bootstrap.jobs.settings import JobSettings, under_root
from node_bootstrap.jobs.spec import utc_now
from node_bootstrap.monitor.service import SYSTEM_PYTHON
from node_bootstrap.monitor.state import Unhealthy, load_state, save_state, state_lock
from node_bootstrap.readiness import build_reason
from node_bootstrap.runner import Runner


def metadata_probe(settings: JobSettings) -> MetadataProbe:
    """The monitor's probe (MetadataProbe.for_node), with its paths under the jobs' root."""
    return MetadataProbe(python=under_root(settings.root, SYSTEM_PYTHON),
                         script=os.path.join(settings.bundle_dir, "node_bootstrap", "metadata_probe.py"),
                         root=settings.root)


def record_unhealthy(settings: JobSettings, detail: str) -> None:
    """The finding in the monitor's state, unless the node is already unhealthy there (the first finding
    stays, as in a round)."""
    host = Host(settings.root)
    with state_lock(host):
        state = load_state(host)
        if state.unhealthy is None:
            state.unhealthy = Unhealthy(build_reason(f"job start: {CHECK}: {detail}"), utc_now())
            save_state(host, state)


def check_metadata_block(settings: JobSettings, job_id: str, runner: Runner | None = None) -> None:
    """Refuse the start of `job_id`, in one line, unless the job user is seen to be kept from the instance
    metadata service; a refusal marks the node unhealthy for the monitor."""
    check = check_metadata_blocked(metadata_probe(settings), runner or Runner())
    if check.status != FAIL:
        return
    record_unhealthy(settings, check.detail)
    raise JobError(f"job {job_id}: refused: the metadata block does not hold ({CHECK}: {check.detail}); "
                   "the node is marked unhealthy, and the health monitor has it replaced")
