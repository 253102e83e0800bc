"""The fake node's firewall and metadata service, for the imdsblock step and the imds-block check.

`iptables`/`ip6tables -w -S CHAIN` print what the real tools print (the formats the real-kernel test in
test_imds_block.py pins), `*-restore --noflush` applies the subset of the restore format the step writes
(declare a chain, which empties it; -A, -I N, -D), and node_bootstrap/metadata_probe.py's answer follows the
rules: the uid's packets to an address walk OUTPUT in order, into jumped-to chains, until ACCEPT, REJECT or
DROP; no verdict is the ACCEPT policy, and then the metadata service answers.

A node's `start` run for real (its own process, no FakeRunner) runs the probe with the root's /usr/bin/python3
(node_bootstrap/jobs/metadata_gate.py): `install_system_python(root)` puts a stand-in there that answers the
probe from a firewall saved in the root (`save(root)`), or, with none saved, from the rules step imdsblock
leaves for the uid the probe runs as (`holding_the_block`).
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from node_bootstrap.imds_block import FAMILIES, render_restore

TOOLS = ("iptables", "ip6tables")
SAVED = "fake-firewall.json"  # in a fake root: the firewall the stand-in system python answers from
REPO = Path(__file__).resolve().parents[1]

# The root's /usr/bin/python3: the probe is answered by the fake firewall; any other call runs the real one.
SYSTEM_PYTHON_STAND_IN = """\
#!{python}
import os, sys
if len(sys.argv) > 2 and sys.argv[2].endswith("metadata_probe.py"):
    sys.path[:0] = [{tests!r}, {repo!r}]
    from node_fake_firewall import answer_probe
    sys.exit(answer_probe({root!r}, sys.argv))
os.execv({python!r}, [{python!r}] + sys.argv[1:])
"""


@dataclass
class FakeFirewall:
    # tool -> chain -> rule specs, each as `iptables -S` prints it after "-A CHAIN "
    chains: dict = field(default_factory=lambda: {tool: {"OUTPUT": []} for tool in TOOLS})
    restores: list = field(default_factory=list)  # (tool, the text it read), in order
    ignore_restores: bool = False  # a restore that reports success and changes nothing

    def install(self, runner) -> None:
        for tool in TOOLS:
            runner.on(tool, lambda argv, tool=tool: self.list_chain(tool, argv))
            runner.on(tool + "-restore", lambda argv, tool=tool: self.restore(tool, argv, runner.stdin))
        answer_python = runner.handlers.get("python3")  # the system interpreter: only the probe is ours
        runner.on("python3", lambda argv: self.probe(argv) if argv[2].endswith("metadata_probe.py")
                  else answer_python(argv), on_path=False)

    def list_chain(self, tool, argv):
        assert argv[1:3] == ["-w", "-S"], argv
        chain = argv[3]
        if chain not in self.chains[tool]:
            return 1, "", (f"{tool} v1.8.8 (nf_tables): chain `{chain}' in table `filter' is incompatible, "
                           "use 'nft' tool.\n")
        head = "-P OUTPUT ACCEPT" if chain == "OUTPUT" else f"-N {chain}"
        return 0, "".join(line + "\n" for line in [head] + [f"-A {chain} {r}" for r in self.chains[tool][chain]])

    def restore(self, tool, argv, text):
        assert argv[1:] == ["-w", "--noflush"], argv
        self.restores.append((tool, text))
        if self.ignore_restores:
            return 0, ""
        chains = {name: list(rules) for name, rules in self.chains[tool].items()}
        lines = text.splitlines()
        assert lines[0] == "*filter" and lines[-1] == "COMMIT", text
        for line in lines[1:-1]:
            if line.startswith(":"):
                chains[line[1:].split()[0]] = []
                continue
            op, chain, *rest = line.split(" ")
            spec = " ".join(rest)
            if op == "-A":
                chains[chain].append(spec)
            elif op == "-I":
                position, spec = int(rest[0]), " ".join(rest[1:])
                chains[chain].insert(position - 1, spec)
            elif op == "-D":
                if spec not in chains[chain]:
                    return 1, "", f"{tool}-restore: line {lines.index(line) + 1} failed\n"
                chains[chain].remove(spec)
            else:
                raise AssertionError(f"unexpected restore line {line!r}")
        self.chains[tool] = chains  # one transaction: all or nothing
        return 0, ""

    def verdict(self, tool, chain, address, uid):
        for spec in self.chains[tool].get(chain, []):
            words = shlex.split(spec)
            option = dict(zip(words[::2], words[1::2], strict=True))
            if "-d" in option and option["-d"].split("/")[0] != address:
                continue
            if "--uid-owner" in option and option["--uid-owner"] != str(uid):
                continue
            target = option["-j"]
            if target in ("ACCEPT", "REJECT", "DROP"):
                return target
            found = self.verdict(tool, target, address, uid)
            if found is not None:
                return found
        return None

    def probe(self, argv):
        uid = int(argv[argv.index("--uid") + 1])
        targets = argv[argv.index("--timeout-s") + 2:]
        results = []
        for target in targets:
            address = target.rpartition(":")[0].strip("[]")
            tool = "ip6tables" if ":" in address else "iptables"
            verdict = self.verdict(tool, "OUTPUT", address, uid) or "ACCEPT"
            error = {"ACCEPT": None, "REJECT": "ConnectionRefusedError: [Errno 111] Connection refused",
                     "DROP": "TimeoutError: timed out"}[verdict]
            results.append({"target": target, "connected": error is None, "error": error})
        return 0, json.dumps({"uid": uid, "targets": results}) + "\n"

    def save(self, root) -> None:
        """This firewall as the one a fake root's stand-in system python answers the probe from."""
        (Path(root) / SAVED).write_text(json.dumps(self.chains))


def holding_the_block(uid: int) -> FakeFirewall:
    """A firewall as step imdsblock leaves it for the job user `uid` (its own restore text, applied)."""
    firewall = FakeFirewall()
    for family in FAMILIES:
        firewall.restore(family.tool, [family.tool + "-restore", "-w", "--noflush"], render_restore(family, str(uid)))
    return firewall


def answer_probe(root, argv) -> int:
    """The stand-in's answer to `python3 -I .../metadata_probe.py --uid U ...`: from the root's saved firewall,
    else from one that holds the block for uid U."""
    saved = Path(root) / SAVED
    uid = int(argv[argv.index("--uid") + 1])
    firewall = FakeFirewall(chains=json.loads(saved.read_text())) if saved.exists() else holding_the_block(uid)
    code, out = firewall.probe(argv)
    sys.stdout.write(out)
    return code


def install_system_python(root) -> None:
    """The stand-in for the fake root's /usr/bin/python3 (SYSTEM_PYTHON_STAND_IN)."""
    path = Path(root) / "usr/bin/python3"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SYSTEM_PYTHON_STAND_IN.format(python=sys.executable, tests=str(Path(__file__).parent),
                                                  repo=str(REPO), root=str(root)))
    path.chmod(0o755)
