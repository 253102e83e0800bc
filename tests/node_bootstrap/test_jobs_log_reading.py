"""What status reads from a job's log: the last step line, and the network NCCL chose (from the lines NCCL and
aws-ofi-nccl print), read from the log's bounded ends."""

import json
import textwrap

import pytest

from node_bootstrap import jobs


def test_last_step_reads_prefixed_lines_and_ignores_noise(tmp_path):
    log = tmp_path / "job.log"
    log.write_text(textwrap.dedent("""\
        [rank0]: {"event": "step", "step": 7, "loss": 2.5}
        {"event": "checkpoint", "step": 7}
        [rank0]: {"event": "step", "step": 8, "loss": 2.25, "tokens_per_s": 1000}
        Traceback (most recent call last): not json {"step"
        """))
    assert jobs.last_step(str(log)) == {"event": "step", "step": 8, "loss": 2.25, "tokens_per_s": 1000}
    assert jobs.last_step(str(tmp_path / "missing.log")) is None


def test_status_reads_the_last_held_out_loss_even_when_later_step_lines_have_none(node_factory):
    node = node_factory("exit")
    job_id = "j-val-1"
    job_dir = node.root / "var/lib/cluster/jobs" / job_id
    job_dir.mkdir(parents=True)
    (job_dir / "status.json").write_text(json.dumps(
        {"jobId": job_id, "state": "succeeded", "exitCode": 0, "startedAt": "2026-11-20T23:15:02Z",
         "endedAt": "2026-11-20T23:45:02Z", "pid": 1, "supervisorPid": 1}))
    (node.root / "var/log/cluster/jobs").mkdir(parents=True, exist_ok=True)
    log = textwrap.dedent("""\
        [rank0]: {"event": "step", "step": 100, "loss": 2.5, "val_loss": 2.75, "val_perplexity": 15.64}
        {"event": "step", "step": 105, "rank": 8}
        [rank0]: {"event": "step", "step": 110, "loss": 2.4}
        [rank0]: {"event": "step", "step": 111, "loss": 2.3, "val_loss": 2.6
        """)  # the last line is still being written: not read
    (node.root / "var/log/cluster/jobs" / f"{job_id}.log").write_text(log)
    out = json.loads(node.cli("status", "--job-id", job_id).stdout)
    assert (out["lastStep"], out["lastLoss"]) == (110, 2.4)
    assert (out["lastValStep"], out["lastValLoss"]) == (100, 2.75)
    (node.root / "var/log/cluster/jobs" / f"{job_id}.log").write_text(log.split("\n")[2] + "\n")
    out = json.loads(node.cli("status", "--job-id", job_id).stdout)
    assert (out["lastValStep"], out["lastValLoss"]) == (None, None)
    # a fresh start's baseline, before its first step (issue 44): step 0's held-out loss
    (node.root / "var/log/cluster/jobs" / f"{job_id}.log").write_text(
        '[rank0]: {"event": "validation", "step": 0, "val_loss": 3.5, "val_perplexity": 33.1}\n'
        + log.split("\n")[2] + "\n")
    out = json.loads(node.cli("status", "--job-id", job_id).stdout)
    assert (out["lastValStep"], out["lastValLoss"]) == (0, 3.5)


# NCCL lines as NCCL and aws-ofi-nccl print them at NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT. Each line follows
# a format string read in the sources (hosts, pids and versions are made up):
# - NVIDIA/nccl src/debug.cc: INFO lines are "<host>:<pid>:<tid> [<cudaDev>] NCCL INFO <msg>", WARN lines
#   "\n<host>:<pid>:<tid> [<cudaDev>] <file>:<line> NCCL WARN <msg>", an optional "[%F %T] " timestamp first.
# - src/init.cc: "Using network %s"; src/plugin/net.cc: "Initialized NET plugin %s", "Assigned NET plugin %s
#   to comm", "Failed to initialize NET plugin %s".
# - aws/aws-ofi-nccl src/nccl_ofi_net.cpp, every message prefixed "NET/OFI ": "Initializing " PACKAGE_STRING,
#   "Using Libfabric version %u.%u", "Plugin selected platform: %s", "Using transport protocol %s (platform
#   set)", "Selected provider is %s, fabric is %s (found %d nics)" (older: "Selected Provider is %s (found %d
#   nics)"); its plugin is named "Libfabric" ("AWS Libfabric" up to 1.11.0).
NCCL_EFA_LOG = """\
[node_bootstrap.jobs] 2026-11-20T23:15:04Z start on ip-10-42-1-4: -m torch.distributed.run --nnodes 2
NCCL version 2.27.5+cuda12.9
ip-10-42-1-4:48211:48327 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.16.0
ip-10-42-1-4:48211:48327 [0] NCCL INFO NET/OFI Using Libfabric version 2.1
ip-10-42-1-4:48211:48327 [0] NCCL INFO NET/OFI Plugin selected platform: AWS
ip-10-42-1-4:48211:48327 [0] NCCL INFO NET/OFI Using transport protocol RDMA (platform set)
ip-10-42-1-4:48211:48327 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 32 nics)
ip-10-42-1-4:48211:48327 [0] NCCL INFO Initialized NET plugin Libfabric
ip-10-42-1-4:48211:48327 [0] NCCL INFO Assigned NET plugin Libfabric to comm
ip-10-42-1-4:48211:48327 [0] NCCL INFO Using network Libfabric
ip-10-42-1-4:48214:48330 [3] NCCL INFO Using network Libfabric
[rank0]: {"event": "step", "step": 10, "loss": 2.0}
"""

# aws-ofi-nccl <= 1.11.0 under torchrun's "[rankN]:" line prefix.
NCCL_OLD_PLUGIN_LOG = """\
[rank0]:ip-10-42-1-5:9021:9140 [0] NCCL INFO NET/OFI Selected Provider is efa (found 32 nics)
[rank0]:ip-10-42-1-5:9021:9140 [0] NCCL INFO Using network AWS Libfabric
"""

# The plugin failed on this node (after picking its provider), IB found no device: NCCL fell back to TCP.
NCCL_SOCKET_LOG = """\
ip-10-42-1-6:7311:7402 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.16.0
ip-10-42-1-6:7311:7402 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 32 nics)

[2026-11-20 23:15:09] ip-10-42-1-6:7311:7402 [0] nccl_net_ofi_init:1415 NCCL WARN NET/OFI aws-ofi-nccl \
initialization failed
ip-10-42-1-6:7311:7402 [0] NCCL INFO Failed to initialize NET plugin Libfabric
ip-10-42-1-6:7311:7402 [0] NCCL INFO NET/IB : No device found.
ip-10-42-1-6:7311:7402 [0] NCCL INFO Failed to initialize NET plugin IB
ip-10-42-1-6:7311:7402 [0] NCCL INFO Initialized NET plugin Socket
ip-10-42-1-6:7311:7402 [0] NCCL INFO Assigned NET plugin Socket to comm
ip-10-42-1-6:7311:7402 [0] NCCL INFO Using network Socket
"""

# A recorded line from an InfiniBand/RoCE cluster (huggingface.co yuccaaa/ProtT3_model, log/nccl_debug.log).
NCCL_IB_LINE = "dsw-251511-c5cfcb8-lwcpt:167975:169648 [5] NCCL INFO Using network IB\n"


def nccl_of(text):
    return jobs.find_nccl_network(jobs.LogEnds("", text))


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (NCCL_EFA_LOG, ("Libfabric", "efa")),
        (NCCL_OLD_PLUGIN_LOG, ("Libfabric", "efa")),  # "AWS Libfabric" is the same plugin
        (NCCL_SOCKET_LOG, ("Socket", None)),  # the failed plugin's provider is not reported
        (NCCL_IB_LINE, ("IB", None)),
        ("[rank0]: {\"event\": \"step\", \"step\": 1, \"loss\": 9.0}\n", (None, None)),  # no communicator yet
    ],
)
def test_nccl_network_from_the_lines_nccl_prints(log, expected):
    assert nccl_of(log) == expected


def test_nccl_network_is_the_newest_and_ignores_a_line_being_written():
    # torchrun restarted the workers (--max-restarts) and NCCL chose again: the newest line counts.
    assert nccl_of(NCCL_EFA_LOG + NCCL_SOCKET_LOG) == ("Socket", None)
    assert nccl_of(NCCL_SOCKET_LOG + NCCL_EFA_LOG) == ("Libfabric", "efa")
    # A line still being written (no newline yet) is not read as a network named "Lib".
    assert nccl_of("ip-10-42-1-4:48211:48327 [0] NCCL INFO Using network Lib") == (None, None)


def test_log_ends_are_bounded_and_the_tail_wins(tmp_path):
    log = tmp_path / "job.log"
    filler = "".join(f'[rank0]: {{"event": "step", "step": {i}, "loss": 1.0}}\n' for i in range(200))
    assert len(filler) > 4096
    log.write_text(NCCL_EFA_LOG + filler + NCCL_SOCKET_LOG.replace("Using network Socket", "Using network X")
                   + filler + NCCL_SOCKET_LOG + filler)
    ends = jobs.read_log_ends(str(log), head_bytes=2048, tail_bytes=4096)
    assert len(ends.head) == 2048 and len(ends.tail) == 4096
    assert jobs.find_nccl_network(ends) == ("Libfabric", "efa")  # the Socket line is in neither end
    assert jobs.find_last_step(ends.tail)["step"] == 199

    log.write_text(NCCL_EFA_LOG + filler + NCCL_SOCKET_LOG)  # the restart's line reached the tail
    assert jobs.find_nccl_network(jobs.read_log_ends(str(log), 2048, 4096)) == ("Socket", None)
    # A log that fits is read whole, once.
    small = jobs.read_log_ends(str(log), head_bytes=len(filler), tail_bytes=len(filler))
    assert small.head == "" and small.tail == log.read_text()
    assert jobs.read_log_ends(str(tmp_path / "missing.log")) is None


def test_status_reports_the_network_nccl_chose(node_factory):
    node = node_factory("exit")
    for job_id, log, network, provider in (("j-efa-1", NCCL_EFA_LOG, "Libfabric", "efa"),
                                           ("j-tcp-1", NCCL_SOCKET_LOG, "Socket", None)):
        job_dir = node.root / "var/lib/cluster/jobs" / job_id
        job_dir.mkdir(parents=True)
        (job_dir / "status.json").write_text(json.dumps(
            {"jobId": job_id, "state": "succeeded", "exitCode": 0, "startedAt": "2026-11-20T23:15:02Z",
             "endedAt": "2026-11-20T23:45:02Z", "pid": 1, "supervisorPid": 1}))
        (node.root / "var/log/cluster/jobs").mkdir(parents=True, exist_ok=True)
        (node.root / "var/log/cluster/jobs" / f"{job_id}.log").write_text(log)
        out = json.loads(node.cli("status", "--job-id", job_id).stdout)
        assert (out["ncclNetwork"], out["ncclProvider"]) == (network, provider)
