"""Step imdsblock: the job user cannot reach the instance metadata service, so no job holds the node role.

Why: IMDS gives the node role's credentials to any local process that asks. HttpPutResponseHopLimit 1 stops
containers, one hop away, not local users. With the role a job could mark nodes Unhealthy, suspend the group,
set the cluster:health* and cluster:bootstrap* tags the keeper trusts, and write fake metrics and logs
(issue 31). Jobs need no AWS credentials: their metrics and logs reach CloudWatch through the agent, which
runs as root (EMF lines in the job log: training/metrics.py).

How: an owner-matched rule rejects what the job user's uid sends to 169.254.169.254, and to fd00:ec2::254,
the IPv6 endpoint of Nitro instances where it is enabled. The rules sit in a chain of their own,
CLUSTER-IMDS-BLOCK, and the filter table's OUTPUT chain jumps to it first.
- iptables and ip6tables, not nft: both node AMIs carry them (Amazon Linux 2023's iptables-nft, Ubuntu 22.04's
  iptables in nf_tables mode, and the DLAMIs' Docker needs them), while `nft` is not on every Ubuntu image.
  With the nf_tables backend the rule is an nftables rule (`meta skuid`) all the same.
- REJECT, not DROP: an SDK in a job that tries IMDS fails at once (connection refused) instead of waiting
  out its timeouts.
- Check before act: `iptables -S` of OUTPUT and of the chain, against the lines iptables itself prints for
  the wanted rules. Only a difference plans an `iptables-restore --noflush`, which refills the chain and puts
  the jump first in one transaction.
- Every boot: cloud-init runs user-data once per instance, and a reboot empties the kernel's rules. So the
  step installs cluster-imds-block.service, which runs this step again at each boot: after the network is up
  (network-online.target: its verification tells the block's REJECT from a network not up yet, issue 42) and
  after the firewall services that load a saved rule set, which may flush; before the SSM agent, through which
  every job comes. No job-user process runs at boot before that: a job's unit ends with the boot.
- Verified: the check `imds-block` runs metadata_probe.py as the job user and passes only when the block
  answers: the IPv4 address refused (the REJECT), the IPv6 one refused or without a route; a connection, a
  missing route to the IPv4 address or a timeout fails it. The step runs it after it acts, the health gate
  (health.py) at boot, the health monitor every round, with `imds-block-service` (the unit did not fail at
  this boot), and every job `start` (jobs/metadata_gate.py): a node whose job user reaches IMDS, or whose block
  is gone, is not ready, or becomes unhealthy, and starts no job.

Runs after `jobuser`, which creates the user (the rule names its uid), and before `training`.
"""

from __future__ import annotations

import errno
import json
import re
from dataclasses import dataclass

from node_bootstrap.accounts import JOB_USER, Account, AccountError, read_account
from node_bootstrap.checks import FAIL, OK, Check
from node_bootstrap.config import DEFAULT_CONFIG_PATH, NodeConfig
from node_bootstrap.errors import StepError
from node_bootstrap.host import Host
from node_bootstrap.monitor.service import SYSTEM_PYTHON, UNIT_DIR
from node_bootstrap.plan import StepPlan
from node_bootstrap.runner import Runner

CHECK = "imds-block"
SERVICE_CHECK = "imds-block-service"
METADATA_IPV4 = "169.254.169.254"
METADATA_IPV6 = "fd00:ec2::254"
METADATA_PORT = 80
CHAIN = "CLUSTER-IMDS-BLOCK"
SERVICE = "cluster-imds-block.service"
CONNECT_TIMEOUT_S = 2.0  # per target; a REJECT answers at once, so only a missing route waits this long
PROBE_TIMEOUT_S = 30.0
INSTALL_HINT = "Amazon Linux 2023: dnf install iptables-nft; Ubuntu: apt-get install iptables"


@dataclass(frozen=True)
class Family:
    tool: str  # iptables or ip6tables; the restore tool is f"{tool}-restore"
    destination: str  # as `iptables -S` prints it
    reject_with: str


FAMILIES = (
    Family("iptables", f"{METADATA_IPV4}/32", "icmp-port-unreachable"),
    Family("ip6tables", f"{METADATA_IPV6}/128", "icmp6-port-unreachable"),
)
JUMP = f"-A OUTPUT -j {CHAIN}"


def block_rule(family: Family, uid_owner: str) -> str:
    """The chain's one rule, exactly as `iptables -S` prints it (so a probe can compare it)."""
    return (f"-A {CHAIN} -d {family.destination} -m owner --uid-owner {uid_owner} "
            f"-j REJECT --reject-with {family.reject_with}")


def render_restore(family: Family, uid_owner: str, *, jump_first: bool = False, jump_elsewhere: bool = False) -> str:
    """iptables-restore --noflush input: declaring the chain empties it, then the rule, then the jump first in
    OUTPUT (moved there when it is elsewhere). One transaction: no moment with the jump and no rule."""
    lines = ["*filter", f":{CHAIN} - [0:0]", block_rule(family, uid_owner)]
    if not jump_first:
        if jump_elsewhere:
            lines.append(f"-D OUTPUT -j {CHAIN}")
        lines.append(f"-I OUTPUT 1 -j {CHAIN}")
    return "\n".join(lines + ["COMMIT"]) + "\n"


# The services that load a saved rule set, which may flush ours: the unit runs after them.
FIREWALL_SERVICES = "iptables.service ip6tables.service nftables.service netfilter-persistent.service firewalld.service"
# The SSM agent (Amazon Linux 2023's package, Ubuntu's snap): no job can be started before the block is set and
# verified at boot, since jobs come through Run Command.
SSM_AGENT_SERVICES = "amazon-ssm-agent.service snap.amazon-ssm-agent.amazon-ssm-agent.service"


def render_service(config: NodeConfig, config_path: str = DEFAULT_CONFIG_PATH) -> str:
    return f"""\
# Written by node_bootstrap (step imdsblock); edits are overwritten.
[Unit]
Description=Block the instance metadata service for the training jobs' user (docs/security.md)
After=network-online.target {FIREWALL_SERVICES}
Wants=network-online.target
Before={SSM_AGENT_SERVICES}

[Service]
Type=oneshot
RemainAfterExit=yes
Environment=PYTHONPATH={config.training.bundle_dir}
ExecStart={SYSTEM_PYTHON} -m node_bootstrap run --only imdsblock --config {config_path}

[Install]
WantedBy=multi-user.target
"""


# ----- the check -----------------------------------------------------------------------------------------------


def format_target(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


@dataclass(frozen=True)
class MetadataProbe:
    """How the check runs the probe: host paths of the interpreter and the script, the root whose user
    database names the job user, and the addresses tried (tests point them at a server on 127.0.0.1)."""

    python: str
    script: str
    root: str
    targets: tuple[tuple[str, int], ...] = ((METADATA_IPV4, METADATA_PORT), (METADATA_IPV6, METADATA_PORT))
    timeout_s: float = CONNECT_TIMEOUT_S

    @classmethod
    def for_node(cls, config: NodeConfig, host: Host) -> MetadataProbe:
        script = host.path(config.training.bundle_dir + "/node_bootstrap/metadata_probe.py")
        return cls(python=SYSTEM_PYTHON, script=script, root=host.root)

    def command_for_job_user(self) -> tuple[str, ...] | None:
        """The probe's command for the job user of `root`; None while there is none (or no readable database)."""
        try:
            account = read_account(self.root, JOB_USER)
        except AccountError:
            return None
        return self.command(account) if account is not None else None

    def command(self, account: Account) -> tuple[str, ...]:
        groups = ",".join(str(g) for g in account.groups)
        return (self.python, "-I", self.script, "--uid", str(account.uid), "--gid", str(account.gid),
                *(("--groups", groups) if groups else ()), "--timeout-s", f"{self.timeout_s:g}",
                *(format_target(a, p) for a, p in self.targets))


# What a connect that did not connect says (the probe's "error": "<exception class>: [Errno N] ..."). Only
# "refused" is the block's own answer (its REJECT); "no route" is the kernel's before any rule is consulted (the
# network is not up yet, or the address has no route: fd00:ec2::254 where the instance has no IPv6).
_REFUSED = "ConnectionRefusedError"
_NO_ROUTE_ERRNOS = {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL}
_ERRNO_RE = re.compile(r"\[Errno ([0-9]+)\]")


def connect_outcome(error: object) -> str:
    """"refused", "no route" or "unknown" (a timeout: a DROP, or nothing answering) for a probe's error."""
    text = str(error or "")
    if text.startswith(_REFUSED):
        return "refused"
    found = _ERRNO_RE.search(text)
    if found and int(found.group(1)) in _NO_ROUTE_ERRNOS:
        return "no route"
    return "unknown"


def check_metadata_blocked(probe: MetadataProbe, runner: Runner) -> Check:
    """imds-block: ok only when the block is seen to hold: every IPv4 target refused (the REJECT answered,
    so the network is up and the rule is there), and every IPv6 one refused or without a route (an instance
    without IPv6). Fails when the job user connects, and when the probe cannot tell a block from a network that
    is not up ("no route" to the IPv4 address) or from a timeout."""
    try:
        account = read_account(probe.root, JOB_USER)
    except AccountError as e:
        return Check(CHECK, FAIL, str(e))
    if account is None:
        return Check(CHECK, OK, f"{JOB_USER} does not exist yet (step jobuser creates it, then step imdsblock "
                                "blocks its way to the metadata service and verifies it)")
    who = f"{JOB_USER} (uid {account.uid})"
    result = runner.run(probe.command(account), mutating=False, check=False, timeout=PROBE_TIMEOUT_S)
    try:
        targets = json.loads(result.stdout)["targets"] if result.ok else None
        reached = [t["target"] for t in targets if t["connected"]] if targets else None
        outcomes = {t["target"]: connect_outcome(t.get("error")) for t in targets} if targets else None
    except (ValueError, KeyError, TypeError):
        reached = outcomes = None
    if reached is None or outcomes is None:
        detail = result.describe_failure() if not result.ok else f"no result in its output {result.stdout!r:.200}"
        return Check(CHECK, FAIL, f"cannot verify that {who} is kept from the instance metadata service: {detail}")
    if reached:
        return Check(CHECK, FAIL, f"{who} can open a connection to the instance metadata service at "
                                  f"{', '.join(reached)}: jobs could take the node role's credentials "
                                  "(step imdsblock blocks it)")
    unproven = [f"{target}: {outcome}" for target, outcome in outcomes.items()
                if outcome != "refused" and not (outcome == "no route" and target.startswith("["))]
    if unproven:
        return Check(CHECK, FAIL, f"cannot tell that {who} is blocked from the instance metadata service: "
                                  f"{', '.join(unproven)} (refused is the block's answer; no route: is the network "
                                  "up?; unknown: a timeout, not the block's REJECT)")
    return Check(CHECK, OK, f"{who} cannot connect to {', '.join(t['target'] for t in targets)}")


def check_block_service(runner: Runner) -> Check:
    """imds-block-service: fails when cluster-imds-block.service failed at this boot (the rules may be missing
    since; the monitor's imds-block check tells whether they are)."""
    result = runner.run(("systemctl", "is-failed", SERVICE), mutating=False, check=False)
    state = result.stdout.strip()
    if state == "failed":
        return Check(SERVICE_CHECK, FAIL, f"{SERVICE} failed at this boot: see journalctl -u {SERVICE}")
    return Check(SERVICE_CHECK, OK, f"{SERVICE}: {state or 'not failed'}")


# ----- the step ------------------------------------------------------------------------------------------------


def plan_imds_block(config: NodeConfig, host: Host, runner: Runner, probe: MetadataProbe | None = None) -> StepPlan:
    plan = StepPlan("imdsblock")
    probe = probe or MetadataProbe.for_node(config, host)
    try:
        account = read_account(host.root, JOB_USER)
    except AccountError as e:
        raise StepError(str(e)) from None
    if account is None and not host.dry_run:
        raise StepError(f"the user {JOB_USER} does not exist: step jobuser creates it (run it first)")
    uid_owner = str(account.uid) if account is not None else JOB_USER  # dry run before jobuser: by name
    for family in FAMILIES:
        _plan_family(plan, runner, family, uid_owner)
    _plan_service(plan, config, host, runner)
    plan.verify = lambda: _verify(probe, runner)
    return plan


def _plan_family(plan: StepPlan, runner: Runner, family: Family, uid_owner: str) -> None:
    for tool in (family.tool, family.tool + "-restore"):
        if runner.which(tool) is None:
            raise StepError(f"{tool} not found: the metadata block for {JOB_USER} needs it ({INSTALL_HINT})")
    output = runner.run((family.tool, "-w", "-S", "OUTPUT"), mutating=False, check=False)
    if not output.ok:
        raise StepError(f"cannot read the firewall's OUTPUT chain: {output.describe_failure()}")
    jumps = [line for line in output.stdout.splitlines() if line.startswith("-A OUTPUT ")]
    jump_first = bool(jumps) and jumps[0] == JUMP
    chain = runner.run((family.tool, "-w", "-S", CHAIN), mutating=False, check=False)  # fails: no chain yet
    current = chain.stdout.splitlines() if chain.ok else []
    wanted = [f"-N {CHAIN}", block_rule(family, uid_owner)]
    if jump_first and current == wanted:
        plan.note(f"{family.tool}: {JOB_USER}'s traffic to {family.destination} is already rejected")
        return
    text = render_restore(family, uid_owner, jump_first=jump_first, jump_elsewhere=JUMP in jumps)
    plan.add(f"reject {JOB_USER}'s traffic to the metadata service {family.destination} ({family.tool} chain "
             f"{CHAIN}, first in OUTPUT): {block_rule(family, uid_owner)}",
             apply=lambda: runner.run((family.tool + "-restore", "-w", "--noflush"), mutating=True,
                                      input_text=text))


def _plan_service(plan: StepPlan, config: NodeConfig, host: Host, runner: Runner) -> None:
    path = f"{UNIT_DIR}/{SERVICE}"
    unit = render_service(config)
    changed = host.read_text(path, default="") != unit
    if changed:
        plan.add(f"write {path}: the block again at every boot, once the network is up and before the SSM agent",
                 apply=lambda: host.write_text(path, unit))
        plan.add("reload systemd's units", argv=("systemctl", "daemon-reload"))
    enabled = runner.run(("systemctl", "is-enabled", SERVICE), mutating=False, check=False)
    if changed or not enabled.ok:
        plan.add(f"enable {SERVICE} (it runs at the next boot; this boot's rules are set above)",
                 argv=("systemctl", "enable", SERVICE))


def _verify(probe: MetadataProbe, runner: Runner) -> None:
    check = check_metadata_blocked(probe, runner)
    if check.status == FAIL:
        raise StepError(check.detail)
