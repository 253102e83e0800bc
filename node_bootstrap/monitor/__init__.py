"""The node health monitor: while a node is in service, re-check it every monitor.intervalSeconds and, when
it has gone bad, say so and get it replaced (docs/operations.md, "When a node fails").

`python3 -m node_bootstrap monitor --once [--dry-run]` runs one round; the boot sequence's `monitor` step
runs the first round and then enables the systemd timer that runs the rest, and the service that runs
`monitor --follow`: it follows the kernel log and answers a fatal Xid at once, without waiting for a round.

Modules, in dependency order: kernel_log (new kernel-log lines since a persisted cursor: journald or
/dev/kmsg), state (what a round remembers for the next), checks (one round's checks, ok/warn/fail),
actions (what an unhealthy node does: stop the job, tag, log, set-instance-health; the warning metric),
rounds (one round, in the order that makes it safe to kill), follow (the kernel-log follower), service (the
boot step and the systemd units),
command (the CLI subcommand).
"""
