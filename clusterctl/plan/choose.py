"""Which node count of each instance type `clusterctl plan` puts forward, and how the types are ranked.

clusterctl.plan.options answers a type at every node count that fits and splits the global batch evenly; here
one of them is picked:
- cost (the default): the cheapest per token among the counts that finish within the horizon (HORIZON_DAYS
  unless --horizon-days). Activation checkpointing costs a third more compute, so a count that runs without it
  is cheaper than a smaller one that needs it; the instances cost the same at any count that runs the same way
  (the time falls as the nodes rise), and FSx's hourly cost then favours more nodes by a little. Counts within
  COST_TIE_FRACTION of the cheapest are taken as equal, below the estimate's precision, and the fewest nodes of
  them wins: fewer nodes are easier to get (quota, capacity). Where no count finishes in time, the fastest,
  marked beyond the horizon.
- time: each type at the count that is fastest within the cluster's limit (the most nodes that split the
  global batch, up to MAX_NODES), so types are compared at their best, not at their smallest.
- --deadline-days: the fewest nodes that finish within it; --nodes: exactly that count.
"""

from __future__ import annotations

import dataclasses

from clusterctl.plan.options import HOURS_PER_DAY, MAX_NODES, Option, at_nodes, plan_counts
from clusterctl.plan.workload import Workload
from instance_catalog.instance_types import InstanceType

HORIZON_DAYS = 30.0  # a plan longer than a month is rarely one anybody runs
COST_TIE_FRACTION = 0.01


def plan_option(
    workload: Workload,
    instance: InstanceType,
    tokens: float,
    *,
    choose: str = "cost",
    nodes: int | None = None,
    deadline_days: float | None = None,
    horizon_days: float = HORIZON_DAYS,
    **plan_args: object,
) -> Option:
    """The option of `instance` to put forward (see the module's docstring); plan_args go to plan_counts."""
    standin, options = plan_counts(workload, instance, tokens, **plan_args)  # type: ignore[arg-type]
    if nodes is not None:
        return at_nodes(standin, options, workload, nodes, plan_args.get("layout"))  # type: ignore[arg-type]
    if not options:
        return standin
    if deadline_days is not None:
        limit_hours = deadline_days * HOURS_PER_DAY
        in_time = [o for o in options if o.hours <= limit_hours]
        if in_time:
            return in_time[0]
        fastest = fastest_of(options)
        return dataclasses.replace(
            fastest,
            problem=f"misses the deadline: {fastest.days:.1f} days on {fastest.nodes} nodes ({limit_reason(fastest)})",
        )
    if choose == "time":
        return fastest_of(options)
    options = [dataclasses.replace(o, horizon_days=horizon_days) for o in options]
    within = [o for o in options if o.within_horizon]
    if not within:
        return fastest_of(options)
    cheapest = min(o.cost_usd for o in within)
    return min((o for o in within if o.cost_usd <= cheapest * (1 + COST_TIE_FRACTION)), key=lambda o: o.nodes)


def fastest_of(options: list[Option]) -> Option:
    return min(options, key=lambda o: (o.hours, o.nodes))


def limit_reason(option: Option) -> str:
    """Why `option` (a type at its fastest) has no more nodes."""
    if option.nodes == option.node_counts[-1] and option.nodes + option.spare_nodes < MAX_NODES:
        return (f"the most that split the global batch; --global-batch-tokens {2 * option.global_batch_tokens} "
                "allows more")
    return "the most a cluster holds"


def rank(options: list[Option], by: str) -> list[Option]:
    """Viable options, cheapest per token (by="cost"; those within the horizon first) or fastest (by="time")
    first; the other figure breaks ties."""
    viable = [o for o in options if o.viable]
    if by == "cost":
        return sorted(viable, key=lambda o: (not o.within_horizon, o.cost_usd, o.hours, o.instance_type.name))
    return sorted(viable, key=lambda o: (o.hours, o.cost_usd, o.instance_type.name))

