"""Plans: what a step found by probing, and the actions it needs to bring the node to the wanted state.

Each step first probes (read-only commands and file reads) and returns a StepPlan; only then are the actions
executed. A node already in the wanted state yields an empty plan, which is what makes a second run a no-op;
`--dry-run` prints the plan instead of executing it.
"""

from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass, field
from typing import Callable

from node_bootstrap.runner import Runner

LOG = logging.getLogger("node_bootstrap")


@dataclass(frozen=True)
class Action:
    summary: str  # what and why, one line: printed in the plan and logged when executed
    argv: tuple[str, ...] = ()  # the mutating command this action runs, when it is exactly one command
    apply: Callable[[], None] | None = None  # Python-side work: file writes, retried or chained commands


@dataclass
class StepPlan:
    step: str
    actions: list[Action] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # facts the probes found, for the log
    verify: Callable[[], None] | None = None  # runs after the actions, never in dry-run

    def add(self, summary: str, argv: tuple[str, ...] = (), apply: Callable[[], None] | None = None) -> None:
        self.actions.append(Action(summary, tuple(argv), apply))

    def note(self, text: str) -> None:
        self.notes.append(text)


def execute_plan(plan: StepPlan, runner: Runner, *, dry_run: bool, print_fn=print) -> None:
    """Log the notes, then print (dry-run) or execute the actions in order, then verify."""
    for note in plan.notes:
        LOG.info("%s: %s", plan.step, note)
    if dry_run:
        if not plan.actions:
            print_fn(f"[{plan.step}] nothing to do")
        for action in plan.actions:
            print_fn(f"[{plan.step}] would {action.summary}")
            if action.argv:
                print_fn(f"    $ {shlex.join(action.argv)}")
        return
    if not plan.actions:
        LOG.info("%s: nothing to do", plan.step)
    for action in plan.actions:
        LOG.info("%s: %s", plan.step, action.summary)
        if action.argv:
            runner.run(action.argv, mutating=True)
        if action.apply is not None:
            action.apply()
    if plan.verify is not None:
        plan.verify()
