"""torchrun (torch.distributed.run) as the nodes run it, with a bounded exit barrier:

    python -m training.torchrun --exit-barrier-seconds 30 <torchrun's arguments>

When its workers succeed, a torchrun agent waits in an exit barrier on the rendezvous store until every agent's
workers are done: 300 s by default (LocalElasticAgent's exit_barrier_timeout, which torchrun's command line does
not reach), inside one blocking store call that a SIGTERM does not interrupt (Python runs the handler only after
the call returns). An agent that was signalled itself never joins that barrier: it stops its workers and exits.

So a stop that reaches one node first left the others' torchrun running for 5 minutes: the signalled node's
trainer asks its peers to stop at the same step (training/faults.py), they save with it and exit 0, and their
agents then wait the full 300 s for an agent that will never come, deaf to their own SIGTERM meanwhile. The
node health monitor's SIGTERM to one node, a cancel that reaches the nodes one after another, and a Capacity
Block's end all do that.

The barrier only keeps agents, and the rendezvous store the first node's agent hosts, alive while the other
nodes' workers may still need the store; nothing the trainer does after its last step's collectives does. When
the bound expires torchrun logs the error and exits with its workers' result, as it does after 300 s.
"""

from __future__ import annotations

import functools
import sys

from training.startup import frozen_imports

EXIT_BARRIER_OPTION = "--exit-barrier-seconds"


def exit_barrier_seconds(argv: list[str]) -> tuple[int | None, list[str]]:
    """The bound from the leading option (None without it) and torchrun's own arguments."""
    if not argv or argv[0] != EXIT_BARRIER_OPTION:
        return None, argv
    value = argv[1] if len(argv) > 1 else ""
    if not value.isdigit() or not 1 <= int(value) <= 3600:
        raise SystemExit(f"training.torchrun: {EXIT_BARRIER_OPTION}={value!r}: allowed: seconds, 1-3600")
    return int(value), argv[2:]


def main(argv: list[str] | None = None, *, freeze_imports: bool = False) -> None:
    """``freeze_imports``: this process is the agent and nothing else (training/startup.py)."""
    bound_s, torchrun_args = exit_barrier_seconds(sys.argv[1:] if argv is None else argv)
    with frozen_imports(freeze_imports):
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
        from torch.distributed.run import main as torchrun_main

    if bound_s is not None:
        # torchrun's launcher builds the agent without this argument: the bound becomes its default
        LocalElasticAgent.__init__ = functools.partialmethod(  # type: ignore[method-assign]
            LocalElasticAgent.__init__, exit_barrier_timeout=float(bound_s))
    torchrun_main(torchrun_args)


if __name__ == "__main__":
    main(freeze_imports=True)
