"""`clusterctl top`'s rendering, without AWS: a ClusterView laid out with rich (captured from its console) as
the nodes table, the job's progress and the cost; idle or hot GPUs and EFA errors in red, the job's state in
bold, and no job."""

from __future__ import annotations

import datetime

from rich.console import Console
from top_support import table_rows

from clusterctl.watch.collect import ClusterView, JobView, NodeView
from clusterctl.watch.view import render


def view(**job_fields) -> ClusterView:
    at = datetime.datetime(2026, 11, 20, 23, 30, tzinfo=datetime.UTC)
    nodes = [
        NodeView("i-0aaaaaaaaaaaaaaa1", "InService", "ready", 97.0, 70_000.0, 81_559.0, 71.0, 690.0, 350.5, 349.0,
                 0.0),
        NodeView("i-0aaaaaaaaaaaaaaa2", "InService", "ready", 4.0, 1_024.0, 81_559.0, 86.0, 120.0, 0.0, 0.0, 2.0),
        NodeView("i-0aaaaaaaaaaaaaaa3", "Pending", "running", None, None, None, None, None, None, None, None),
    ]
    job = JobView(**{"job_id": "j-1", "step": 500, "run_steps": 2000, "loss": 3.1415, "tokens_per_s": 1.25e6,
                     "mfu_pct": 41.5, "step_time_max_s": 1.2, "step_time_median_s": 0.9, "straggler_ratio": 1.33,
                     "slowest_rank": 12, "eta_s": 1800.0, "updated_at": at, **job_fields})
    return ClusterView(stack_name="TrainingClusterStack", instance_type="p5.48xlarge", node_count=3,
                       collected_at=at, nodes=nodes, job=job, group_created_at=at - datetime.timedelta(hours=5),
                       cost_usd=825.6, usd_per_node_hour=55.04)


def test_render_lays_out_nodes_job_and_cost():
    console = Console(width=150, color_system=None)
    with console.capture() as capture:
        console.print(render(view()))
    text = capture.get()
    assert "TrainingClusterStack   2/3 x p5.48xlarge in service   as of 2026-11-20T23:30:00Z" in text
    assert "cost so far ~$825.60 since 2026-11-20T18:30:00Z (nodes in service x $55.04/h On-Demand" in text
    rows = table_rows(text)
    assert rows["i-0aaaaaaaaaaaaaaa1"] == {"NODE": "i-0aaaaaaaaaaaaaaa1", "STATE": "InService", "GPU": "97%",
                                           "MEM": "68.4/80 GiB", "TEMP": "71 C", "POWER": "690 W",
                                           "EFA TX": "350.5", "EFA RX": "349.0", "ERR": "0"}
    assert rows["i-0aaaaaaaaaaaaaaa3"]["STATE"] == "Pending/running"
    assert "step 500/2000 (25%)   loss 3.1415   ETA 0h30m" in text
    assert "tokens/s 1,250,000   MFU 41.5%" in text and "slowest/median x1.33 (rank 12)" in text


def test_render_shows_the_newest_held_out_loss_only_for_a_job_that_has_one():
    console = Console(width=150, color_system=None)
    with console.capture() as capture:
        console.print(render(view(val_loss=2.3456, val_perplexity=10.4398)))
    lines = capture.get().splitlines()
    (step,) = [i for i, line in enumerate(lines) if "step 500/2000 (25%)" in line]
    assert "validation loss 2.3456   perplexity 10.44" in lines[step + 1]
    with console.capture() as capture:
        console.print(render(view()))
    assert "validation loss" not in capture.get()


def test_render_marks_idle_gpus_hot_gpus_and_efa_errors_in_red():
    console = Console(width=150, force_terminal=True, color_system="standard")
    with console.capture() as capture:
        console.print(render(view()))
    idle = next(line for line in capture.get().splitlines() if "i-0aaaaaaaaaaaaaaa2" in line)
    red, reset = "\x1b[1;31m", "\x1b[0m"
    assert f"{red} 4%{reset}" in idle and f"{red}86 C{reset}" in idle and f"{red}  2{reset}" in idle
    busy = next(line for line in capture.get().splitlines() if "i-0aaaaaaaaaaaaaaa1" in line)
    assert red not in busy


def test_render_without_a_job():
    console = Console(width=150, color_system=None)
    with console.capture() as capture:
        console.print(render(ClusterView(**{**view().__dict__, "job": None})))
    assert "no job has reported a step in the last 3 hours" in capture.get()


def test_render_shows_the_state_in_bold_so_a_stale_step_is_not_read_as_a_hang():
    console = Console(width=150, force_terminal=True, color_system="standard")
    restarting = view(state="restarting", attempt=3, restarts=2, max_job_restarts=5, nodes=3,
                      reason="node i-0aaaaaaaaaaaaaaa2 is unhealthy (Xid 79)")
    with console.capture() as capture:
        console.print(render(ClusterView(**{**restarting.__dict__, "job_source": "job table"})))
    assert "\x1b[1;33mrestarting\x1b[0m, attempt 3 (restarts: 2 of at most 5)" in capture.get()
    assert "the job keeper starts attempt 4 once 3 nodes are ready" in capture.get()
    assert "last record 2026-11-20T23:30:00Z (under a minute ago)" in capture.get()
