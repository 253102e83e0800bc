"""training/startup.py: a program's imports run without the cycle collector and are frozen after. Checked in
child processes: a freeze in the pytest worker would outlive the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Containers enough to set off collections (a generation-0 collection every 700 allocations); what the callback
# saw, whether the collector was on, and the freeze count, inside and after each block.
BLOCKS = """
import gc, json, sys
from training.startup import frozen_imports

started = []
gc.callbacks.append(lambda phase, info: phase == "start" and started.append(info["generation"]))

def block(**kwargs):
    before = len(started)
    with frozen_imports(**kwargs):
        built = [[i] for i in range(20000)]
        inside = {"collections": len(started) - before, "enabled": gc.isenabled()}
    return {"inside": inside, "enabled_after": gc.isenabled(), "frozen_after": gc.get_freeze_count(), "built": built}

report = {}
kept = block(freeze=False)
report["unfrozen"] = {k: v for k, v in kept.items() if k != "built"}
kept = block()
report["frozen"] = {k: v for k, v in kept.items() if k != "built"}
gc.unfreeze()
gc.disable()
report["already_off"] = {k: v for k, v in block().items() if k != "built"}
gc.enable()
gc.unfreeze()
try:
    with frozen_imports():
        raise ImportError("no such module")
except ImportError:
    report["failed"] = {"enabled_after": gc.isenabled(), "frozen_after": gc.get_freeze_count()}
print(json.dumps(report))
"""


def run_child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})


def test_the_imports_run_uncollected_and_what_they_built_is_frozen_after():
    proc = run_child(BLOCKS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    # freeze=False (a test calling a program's main): the collector runs as ever and nothing is frozen
    assert report["unfrozen"]["inside"]["collections"] > 0 and report["unfrozen"]["inside"]["enabled"]
    assert report["unfrozen"]["frozen_after"] == 0
    # the program: no collection during the block, the collector back on after it, and the 20,000 lists frozen
    assert report["frozen"]["inside"] == {"collections": 0, "enabled": False}
    assert report["frozen"]["enabled_after"] is True and report["frozen"]["frozen_after"] > 20000
    # a collector its caller had turned off stays off
    assert report["already_off"]["enabled_after"] is False
    # an import that fails freezes nothing and leaves the collector on
    assert report["failed"] == {"enabled_after": True, "frozen_after": 0}


def test_the_torchrun_agent_freezes_its_imports_only_as_the_program():
    agent = ("import gc, sys\nfrom training.torchrun import main\n"
             "try:\n    main(['--help'], freeze_imports={freeze})\nexcept SystemExit:\n    pass\n"
             "print('frozen', gc.get_freeze_count(), 'enabled', gc.isenabled(), file=sys.stderr)\n")
    as_program = run_child(agent.format(freeze=True))
    assert "usage: " in as_program.stdout, as_program.stderr[-3000:]  # torchrun's own help: its imports ran
    frozen = int(as_program.stderr.split("frozen ")[1].split()[0])
    assert frozen > 10000 and as_program.stderr.rstrip().endswith("enabled True")
    called = run_child(agent.format(freeze=False))
    assert called.stderr.rstrip().endswith("frozen 0 enabled True"), called.stderr[-2000:]
