"""A fake P5 node for node_bootstrap's tests: a fake root on disk whose tool handlers answer like the real
tools (from the recorded formats in tests/node_bootstrap/fixtures/) and change the fake machine the way the
real commands would (mdadm --create makes an array, mkfs writes a signature, mount adds a /proc/mounts line).

The code under test is the real node_bootstrap: only the external binaries are replaced.
tests/node_bootstrap/conftest.py builds the machine (build_fake_node) and wires these handlers to the runner.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from node_fake_python import FakeAmiPython
from node_fakes import INSTANCE_ID, REGION, SITE_PACKAGES, FakeGroup, FakeRunner, fixture_text

from node_bootstrap.host import Host
from node_bootstrap.imds import InstanceIdentity


@dataclass
class MdArray:
    name: str
    kernel_name: str
    members: list


@dataclass
class FakeNode:
    """A p5.48xlarge as node_bootstrap sees it, under `root`."""

    root: Path
    runner: FakeRunner
    signatures: dict = field(default_factory=dict)  # host device path -> blkid export fields
    arrays: dict = field(default_factory=dict)  # array host path -> MdArray
    tags: dict = field(default_factory=dict)
    health_status: str = "Healthy"
    lustre_module: bool = True
    lustre_mount_failures: int = 0  # the next N lustre mounts fail
    lustre_installable: bool = True
    agent_running: bool = False
    agent_config_loads: int = 0
    gpu_csv: str = "nvidia-smi-query-gpu.p5.csv"
    remap_csv: str = "nvidia-smi-query-remapped-rows.p5.csv"
    fi_info_txt: str = "fi_info-efa-rdm.p5.txt"
    kernel_log: str = "journal-kernel-clean.txt"
    throttle_csv: str = "nvidia-smi-query-throttle.p5.csv"
    nvlink_txt: str = "nvidia-smi-nvlink-status.p5.txt"
    enabled_units: set = field(default_factory=set)  # systemctl enable
    group: FakeGroup = field(default_factory=FakeGroup)
    dlami_unit: dict | None = None  # systemctl show properties of dlami-nvme.service; None: not a DLAMI
    dlami_mounts_on_start: bool = True  # `systemctl start dlami-nvme.service` finishes the AMI's mount
    daemon_reloads: int = 0
    units: dict = field(default_factory=lambda: {"nvidia-fabricmanager": "active"})  # is-active answers
    cuda_probe: dict = field(default_factory=lambda: {  # what node_bootstrap.cuda_probe prints on a good P5
        "ok": True, "error": None, "count": 8,
        "devices": [{"index": i, "ok": True, "error": None} for i in range(8)]})
    ami_python: FakeAmiPython = None  # the DLAMI's interpreter (node_fake_python.py); set in __post_init__
    # `stat` answers: node path -> (permission bits, uid, gid); what is not listed is 0755 root:root, and
    # every GPU and EFA device node 0666 root:root (the NVIDIA driver's default) unless listed
    stats: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.ami_python is None:
            self.ami_python = FakeAmiPython(path=self.path)

    # ----- building the machine -----
    def path(self, node_path: str) -> str:
        return str(self.root / node_path.lstrip("/"))

    def write(self, node_path: str, text: str) -> None:
        p = Path(self.path(node_path))
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    def add_mount(self, source: str, node_mount_point: str, fstype: str, options: str = "rw") -> None:
        with open(self.path("/proc/mounts"), "a") as f:
            f.write(f"{source} {self.path(node_mount_point)} {fstype} {options} 0 0\n")

    def add_nvme(self, name: str, model: str, by_id: str) -> None:
        self.write(f"/sys/block/{name}/device/model", model.ljust(40) + "\n")  # sysfs pads the model
        Path(self.path(f"/sys/block/{name}/holders")).mkdir(parents=True, exist_ok=True)
        Path(self.path("/dev")).mkdir(parents=True, exist_ok=True)
        Path(self.path(f"/dev/{name}")).touch()
        link = Path(self.path(f"/dev/disk/by-id/{by_id}"))
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(f"../../{name}")

    def instance_store_paths(self):
        return [self.path(f"/dev/nvme{i}n1") for i in range(1, 9)]

    def host(self, *, dry_run: bool = False, print_fn=print) -> Host:
        return Host(str(self.root), dry_run=dry_run, print_fn=print_fn)

    def identity(self) -> InstanceIdentity:
        return InstanceIdentity(INSTANCE_ID, REGION)

    def fstab(self) -> str:
        p = Path(self.path("/etc/fstab"))
        return p.read_text() if p.exists() else ""

    def mounts_text(self) -> str:
        return Path(self.path("/proc/mounts")).read_text()

    # ----- tool handlers -----
    def blkid(self, argv):
        device = argv[-1]
        fields = self.signatures.get(os.path.realpath(device)) or self.signatures.get(device)
        if not fields:
            return 2, ""
        return 0, "".join(f"{k}={v}\n" for k, v in {"DEVNAME": device, **fields}.items())

    def mdadm(self, argv):
        if argv[1:] == ["--detail", "--scan"]:
            uuid_ = "5d2c1f8e:9a3b4c7d:e1f20a3b:4c5d6e7f"
            lines = [f"ARRAY /dev/md/{a.name} metadata=1.2 name=any:{a.name} UUID={uuid_}"
                     for a in self.arrays.values()]
            return 0, "".join(line + "\n" for line in lines)
        mode, array_path = argv[1], argv[2]
        devices = [a for a in argv[3:] if not a.startswith("--")]
        name = os.path.basename(array_path)
        if mode == "--create":
            busy = [d for d in devices if self.signatures.get(d)]
            if busy:
                return 1, "", f"mdadm: {busy[0]} appears to contain an existing filesystem\nmdadm: aborted"
            for d in devices:
                self.signatures[d] = {"UUID": "5d2c1f8e-9a3b-4c7d-e1f2-0a3b4c5d6e7f",
                                      "LABEL": f"any:{name}", "TYPE": "linux_raid_member"}
        elif mode == "--assemble":
            if any(self.signatures.get(d, {}).get("LABEL") != f"any:{name}" for d in devices):
                return 1, "", "mdadm: no RAID superblock"
        else:
            raise AssertionError(f"unexpected mdadm call {argv}")
        kernel_name = "md127"
        Path(self.path(f"/dev/{kernel_name}")).touch()
        link = Path(self.path(f"/dev/md/{name}"))
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(f"../{kernel_name}")
        for d in devices:
            Path(self.path(f"/sys/block/{os.path.basename(d)}/holders/{kernel_name}")).touch()
        self.arrays[array_path] = MdArray(name, kernel_name, devices)
        return 0, "", f"mdadm: array {array_path} started.\n"

    def mkfs(self, fstype):
        def handler(argv):
            target = argv[-1]
            if self.signatures.get(os.path.realpath(target)):
                return 1, "", f"mkfs.{fstype}: {target} appears to contain an existing filesystem"
            label = argv[argv.index("-L") + 1]
            fields = {"LABEL": label, "UUID": str(uuid.uuid4()), "TYPE": fstype}
            self.signatures[os.path.realpath(target)] = fields
            return 0, f"meta-data={target} isize=512 agcount=32\n"
        return handler

    def nvme_list(self, argv):
        """The recorded `nvme list -o json`, limited to the devices this fake node has."""
        data = json.loads(fixture_text("nvme-list.p5.json"))
        data["Devices"] = [d for d in data["Devices"] if os.path.exists(self.path(d["DevicePath"]))]
        return 0, json.dumps(data, indent=2)

    def systemctl(self, argv):
        verb = argv[1]
        if verb == "show" and argv[2] == "dlami-nvme.service":
            unit = self.dlami_unit or {"LoadState": "not-found", "ActiveState": "inactive", "SubState": "dead",
                                       "Result": "success", "UnitFileState": ""}
            return 0, "".join(f"{k}={v}\n" for k, v in unit.items())
        if verb == "start" and argv[2] == "dlami-nvme.service":
            assert self.dlami_unit is not None
            self.dlami_unit.update(ActiveState="active", SubState="exited")
            if self.dlami_mounts_on_start:
                self.add_mount("/dev/mapper/vg.01-lv_ephemeral", "/opt/dlami/nvme", "ext4",
                               "rw,noatime,nodiratime")
            return 0, ""
        if verb == "daemon-reload":
            self.daemon_reloads += 1
            return 0, ""
        if verb == "is-active":
            state = self.units.get(argv[-1], "inactive")
            return (0 if state == "active" else 3), state + "\n"
        if verb == "is-enabled":
            return (0, "enabled\n") if argv[-1] in self.enabled_units else (1, "disabled\n")
        if verb == "is-failed":  # exit 0 only for a failed unit (systemctl(1))
            state = self.units.get(argv[-1], "inactive")
            return (0 if state == "failed" else 1), state + "\n"
        if verb in ("restart", "enable", "disable"):  # units node_bootstrap writes (monitor, EFA collector)
            unit = argv[-1]
            if verb != "disable" and not Path(self.path(f"/etc/systemd/system/{unit}")).exists():
                return 5, "", f"Failed to {verb} {unit}: Unit {unit} not found.\n"
            if verb == "enable":
                self.enabled_units.add(unit)
            elif verb == "disable":
                self.enabled_units.discard(unit)
            if "--now" in argv or verb == "restart":
                self.units[unit] = "inactive" if verb == "disable" else "active"
            return 0, ""
        raise AssertionError(f"unexpected systemctl call {argv}")

    def dlami_volume(self, *, mounted: bool, unit_state: str = "active") -> None:
        """The DLAMI's dlami-nvme.service at work: every instance-store device an LVM physical volume of vg.01,
        held by the device mapper's vg.01-lv_ephemeral (dm-0), ext4 on it; mounted or (the race) not yet."""
        Path(self.path("/sys/block/dm-0/dm")).mkdir(parents=True, exist_ok=True)
        self.write("/sys/block/dm-0/dm/name", "vg.01-lv_ephemeral\n")
        for i, device in enumerate(self.instance_store_paths(), start=1):
            self.signatures[device] = {"UUID": f"pv-{i}", "VERSION": "LVM2 001", "TYPE": "LVM2_member"}
            Path(self.path(f"/sys/block/nvme{i}n1/holders/dm-0")).touch()
        Path(self.path("/dev/mapper")).mkdir(parents=True, exist_ok=True)
        Path(self.path("/dev/dm-0")).touch()
        mapper = Path(self.path("/dev/mapper/vg.01-lv_ephemeral"))
        if not mapper.is_symlink():
            mapper.symlink_to("../dm-0")
        self.signatures[os.path.realpath(str(mapper))] = {"UUID": str(uuid.uuid4()), "TYPE": "ext4"}
        self.dlami_unit = {"LoadState": "loaded", "ActiveState": unit_state,
                           "SubState": {"active": "exited", "activating": "start"}.get(unit_state, "dead"),
                           "Result": "success", "UnitFileState": "enabled"}
        if mounted:
            self.add_mount("/dev/mapper/vg.01-lv_ephemeral", "/opt/dlami/nvme", "ext4", "rw,noatime,nodiratime")

    def mount(self, argv):
        fstype = argv[argv.index("-t") + 1]
        options = argv[argv.index("-o") + 1]
        source, target = argv[-2], argv[-1]
        if fstype == "lustre":
            if self.lustre_mount_failures > 0:
                self.lustre_mount_failures -= 1
                return 5, "", f"mount.lustre: mount {source} at {target} failed: Input/output error"
            source = "172.31.5.10@tcp:/" + source.rsplit(":/", 1)[1]  # the kernel shows the server's IP
        else:
            source = os.path.realpath(source)
        with open(self.path("/proc/mounts"), "a") as f:
            f.write(f"{source} {target} {fstype} rw,{options} 0 0\n")
        return 0, ""

    def nvidia_smi(self, argv):
        if argv[1].startswith("--query-gpu=index,pci.bus_id,clocks_event_reasons."):
            return 0, fixture_text(self.throttle_csv)
        if argv[1].startswith("--query-gpu="):
            return 0, fixture_text(self.gpu_csv)
        if argv[1].startswith("--query-remapped-rows="):
            return 0, fixture_text(self.remap_csv)
        if argv[1:] == ["nvlink", "--status"]:
            return 0, fixture_text(self.nvlink_txt)
        raise AssertionError(f"unexpected nvidia-smi call {argv}")

    def passwd_lines(self):
        return Path(self.path("/etc/passwd")).read_text().splitlines()

    def group_lines(self):
        return Path(self.path("/etc/group")).read_text().splitlines()

    def useradd(self, argv):
        name = argv[-1]
        home = argv[argv.index("--home-dir") + 1]
        shell = argv[argv.index("--shell") + 1]
        if any(line.split(":")[0] == name for line in self.passwd_lines()):
            return 9, "", f"useradd: user '{name}' already exists"
        uid = gid = 998  # useradd --system picks below SYS_UID_MAX
        with open(self.path("/etc/passwd"), "a") as f:
            f.write(f"{name}:x:{uid}:{gid}:training jobs (node_bootstrap):{home}:{shell}\n")
        with open(self.path("/etc/group"), "a") as f:
            f.write(f"{name}:x:{gid}:\n")
        Path(self.path(home)).mkdir(parents=True)
        self.stats[home] = (0o750, uid, gid)
        return 0, ""

    def usermod(self, argv):
        assert argv[1:3] == ["--append", "--groups"], argv
        wanted, user = argv[3].split(","), argv[4]
        lines = []
        for line in self.group_lines():
            name, x, gid, members = line.split(":")
            if name in wanted:
                members = ",".join([m for m in members.split(",") if m] + [user])
            lines.append(f"{name}:{x}:{gid}:{members}")
        Path(self.path("/etc/group")).write_text("\n".join(lines) + "\n")
        return 0, ""

    def chown(self, argv):
        user = argv[1].split(":")[0]
        (entry,) = [line.split(":") for line in self.passwd_lines() if line.split(":")[0] == user]
        for host_path in argv[2:]:
            node_path = "/" + os.path.relpath(host_path, self.root)
            mode = self.stat_of(node_path)[0]
            self.stats[node_path] = (mode, int(entry[2]), int(entry[3]))
        return 0, ""

    def chmod(self, argv):
        assert argv[1] == "go-w", argv  # the only change the jobuser step makes
        for host_path in argv[2:]:
            node_path = "/" + os.path.relpath(host_path, self.root)
            mode, uid, gid = self.stat_of(node_path)
            self.stats[node_path] = (mode & ~0o022, uid, gid)
        return 0, ""

    def stat_of(self, node_path):
        if node_path in self.stats:
            return self.stats[node_path]
        if node_path.startswith(("/dev/nvidia", "/dev/infiniband/")):
            return 0o666, 0, 0
        return 0o755, 0, 0

    def stat(self, argv):
        assert argv[1:4] == ["-L", "-c", "%a %u %g %n"], argv
        lines = []
        for host_path in argv[4:]:
            if not os.path.exists(host_path):
                return 1, "", f"stat: cannot statx '{host_path}': No such file or directory"
            mode, uid, gid = self.stat_of("/" + os.path.relpath(host_path, self.root))
            lines.append(f"{mode:o} {uid} {gid} {host_path}")
        return 0, "".join(line + "\n" for line in lines)

    def aws(self, argv):
        service, op = argv[1], argv[2]
        if (service, op) == ("ec2", "describe-tags"):
            tags = [{"Key": k, "ResourceId": INSTANCE_ID, "ResourceType": "instance", "Value": v}
                    for k, v in self.tags.items()]
            return 0, json.dumps({"Tags": tags})
        if (service, op) == ("ec2", "create-tags"):
            raw = argv[argv.index("--tags") + 1]
            if raw.startswith("["):
                self.tags.update({t["Key"]: t["Value"] for t in json.loads(raw)})
            else:
                key, value = (p.split("=", 1)[1] for p in raw.split(","))
                self.tags[key] = value
            return 0, ""
        if (service, op) == ("ec2", "delete-tags"):
            self.tags.pop(argv[argv.index("--tags") + 1].split("=", 1)[1], None)
            return 0, ""
        if (service, op) == ("autoscaling", "set-instance-health"):
            self.health_status = argv[argv.index("--health-status") + 1]
            return 0, ""
        answer = self.group.handle(service, op, argv)
        if answer is not None:
            return answer
        raise AssertionError(f"unexpected aws call {argv}")

    def python(self, argv):
        if argv[1:3] == ["-m", "node_bootstrap.cuda_probe"]:
            return (0 if self.cuda_probe["ok"] else 1), json.dumps(self.cuda_probe) + "\n"
        answer = self.ami_python.answer(argv)
        if answer is not None:
            return answer
        code = argv[2]
        if "sysconfig" in code:
            return 0, SITE_PACKAGES + "\n"
        if code == "import training":
            pth = Path(self.path(SITE_PACKAGES + "/cluster-bundle.pth"))
            bundle = pth.read_text().strip() if pth.exists() else None
            if bundle and Path(self.path(bundle + "/training/__init__.py")).exists():
                return 0, ""
            return 1, "", "ModuleNotFoundError: No module named 'training'"
        raise AssertionError(f"unexpected python call {argv}")

    def dnf(self, argv):
        package = argv[-1]
        if package == "lustre-client":
            self.lustre_module = self.lustre_installable
        elif package == "amazon-cloudwatch-agent":
            self.write("/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl", "#!/bin/sh\n")
        else:
            raise AssertionError(f"unexpected dnf install {package}")
        return 0, f"Installed: {package}\nComplete!\n"

    def agent_ctl(self, argv):
        action = argv[argv.index("-a") + 1]
        if action == "status":
            return 0, json.dumps({"status": "running" if self.agent_running else "stopped",
                                  "starttime": "", "configstatus": "configured", "version": "1.300052.0"})
        if action == "fetch-config":
            self.agent_config_loads += 1
            self.agent_running = True
            return 0, "Successfully fetched the config and saved it\n"
        if action == "start":
            self.agent_running = True
            return 0, ""
        raise AssertionError(f"unexpected agent action {argv}")
