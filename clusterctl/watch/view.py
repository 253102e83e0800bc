"""`clusterctl top` on the terminal: a rich table of the nodes and a panel for the active job (its state and
attempt from the job table, its step metrics), redrawn in place (rich.live) every --interval seconds, or printed
once (--once, --json) for scripts."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from cluster_jobs.goodput import summary_line
from clusterctl.jobs import view as job_view
from clusterctl.render import format_time, format_usd, terminal_safe
from clusterctl.watch.collect import JOB_FROM_METRICS, ClusterView, JobView, NodeView

if TYPE_CHECKING:
    pass


IDLE_GPU_PCT = 10.0  # below this a GPU is idle (the stack's idleGpuUtilizationPercent default)


HOT_GPU_C = 85.0  # H100/H200 slow down near 87-90 C (NVIDIA data center GPU datasheets: max operating temp)


PLAIN_WIDTH = 132  # the table's width when the output is not a terminal (a pipe, a file, a test)


def _num(value: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _shown(text: str) -> Text:
    """A cell of text from outside (a tag, a record): a Text, so rich reads no markup in it, with control
    characters as escapes."""
    return Text(terminal_safe(text, keep=""))


def _gpu_cell(pct: float | None) -> Text:
    if pct is None:
        return Text("-", style="dim")
    style = "bold red" if pct < IDLE_GPU_PCT else "yellow" if pct < 50 else "green"
    return Text(f"{pct:.0f}%", style=style)


def _memory_cell(node: NodeView) -> str:
    if node.gpu_memory_used_mib is None:
        return "-"
    used = f"{node.gpu_memory_used_mib / 1024:.1f}"
    if node.gpu_memory_total_mib:
        return f"{used}/{node.gpu_memory_total_mib / 1024:.0f} GiB"
    return f"{used} GiB"


def _temperature_cell(celsius: float | None) -> Text:
    if celsius is None:
        return Text("-", style="dim")
    return Text(f"{celsius:.0f} C", style="bold red" if celsius >= HOT_GPU_C else "")


def _errors_cell(count: float | None) -> Text:
    if count is None:
        return Text("-", style="dim")
    return Text(f"{count:.0f}", style="bold red" if count > 0 else "")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes = int(round(seconds / 60))
    return f"{minutes // 60}h{minutes % 60:02d}m"


def nodes_table(view: ClusterView) -> Table:
    table = Table(title=f"Nodes ({len(view.nodes)} of {view.node_count})", title_justify="left", expand=False,
                  caption="GPU: mean utilization of the node's GPUs; MEM and POWER: per GPU; TEMP: hottest GPU; "
                  "EFA: all devices, Gbit/s; ERR: EFA error events", caption_justify="left")
    table.add_column("NODE", no_wrap=True, min_width=19)
    table.add_column("STATE", no_wrap=True)
    for header in ("GPU", "MEM", "TEMP", "POWER", "EFA TX", "EFA RX", "ERR"):
        table.add_column(header, justify="right", no_wrap=True)
    for node in view.nodes:
        state = node.lifecycle if node.bootstrap in (None, "ready") else f"{node.lifecycle}/{node.bootstrap}"
        table.add_row(_shown(node.instance_id), _shown(state), _gpu_cell(node.gpu_utilization_pct), _memory_cell(node),
                      _temperature_cell(node.gpu_temperature_c), _num(node.gpu_power_w, "{:.0f} W"),
                      _num(node.efa_tx_gbps, "{:.1f}"), _num(node.efa_rx_gbps, "{:.1f}"),
                      _errors_cell(node.efa_error_events))
    return table


def _age(seconds: float) -> str:
    if seconds < 60:
        return "under a minute ago"
    if seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    return f"{_duration(seconds)} ago"


def job_panel(view: ClusterView) -> Panel:
    job = view.job
    if job is None:
        return Panel(Text(terminal_safe(_no_job_text(view)), style="dim"), title="Job", title_align="left")
    steps = f"{_num(job.step)}/{_num(job.run_steps)}"
    if job.step is not None and job.run_steps:
        steps += f" ({100 * job.step / job.run_steps:.0f}%)"
    straggler = "-"
    if job.straggler_ratio is not None:
        straggler = f"x{job.straggler_ratio:.2f} (rank {_num(job.slowest_rank)})"
    lines = _record_lines(job)
    lines += [
        f"step {steps}   loss {_num(job.loss, '{:.4f}')}   ETA {_duration(job.eta_s)}",
        *_validation_lines(job),
        f"tokens/s {_num(job.tokens_per_s, '{:,.0f}')}   MFU {_num(job.mfu_pct, '{:.1f}%')}   "
        f"step time {_num(job.step_time_max_s, '{:.3f}')} s (median rank {_num(job.step_time_median_s, '{:.3f}')}"
        f" s)   slowest/median {straggler}",
        _last_record_line(job, view.collected_at),
    ]
    text = Text(terminal_safe("\n".join(lines)))  # the record's reason and tier: text a node may have sent
    if job.state is not None:  # the first line; bold, so that a stale step under a restart is not read as a hang
        text.stylize("bold green" if job.state == "running" else "bold yellow", 0, len(job.state))
    return Panel(text, title=Text(f"Job {terminal_safe(job.job_id, keep='')}"), title_align="left")


def _validation_lines(job: JobView) -> list[str]:
    """The newest held-out loss, for a job with [validation] that has evaluated it; nothing otherwise."""
    if job.val_loss is None:
        return []
    return [f"validation loss {job.val_loss:.4f}   perplexity {_num(job.val_perplexity, '{:,.2f}')}"]


def _no_job_text(view: ClusterView) -> str:
    if view.job_source == JOB_FROM_METRICS:  # a stack deployed before the job table
        return "no job has reported a step in the last 3 hours"
    ended = view.ended_job
    if ended is not None:
        return (f"no active job (the last one, {ended.job_id}, ended {ended.state} at "
                f"{format_time(ended.ended_at) or '-'}): the cluster takes the next submit")
    return "no active job in the job table: the cluster takes the next submit (clusterctl jobs lists past jobs)"


def _record_lines(job: JobView) -> list[str]:
    """The job table's view of the job: its state and attempt (job_view's wording, as `clusterctl status`),
    why, and what a restart is waiting for. Nothing on a stack deployed before the job table."""
    if job.state is None or job.attempt is None or job.max_job_restarts is None:
        return []
    lines = [job_view.attempt_summary(job.state, job.attempt, job.max_job_restarts)]
    if job.goodput is not None:  # the record's time since the submit: how much of it trained
        lines.append(summary_line(job.goodput))
    if job.reason:
        lines.append(f"reason: {job.reason}")
    if job.state == "restarting":
        lines.append(f"the job keeper starts attempt {job.attempt + 1} once {_num(job.nodes)} nodes are ready: no "
                     "steps until then")
    elif job.attempt > 1 and job.resumed_from_step is not None:
        tier = f" ({job.resumed_from_tier} tier)" if job.resumed_from_tier else ""
        lines.append(f"attempt {job.attempt} resumed from the checkpoint at step {job.resumed_from_step}{tier}")
    return lines


def _last_record_line(job: JobView, now: datetime.datetime) -> str:
    if job.updated_at is None:
        if job.state is None:
            return "last record -"
        return "last record: none in the last 3 hours"
    line = f"last record {format_time(job.updated_at)} ({_age((now - job.updated_at).total_seconds())})"
    if job.state == "restarting":
        line += f": attempt {job.attempt}'s, before it ended"
    elif job.attempt_started_at is not None and job.updated_at < job.attempt_started_at:
        line += f": from before attempt {job.attempt} started at {format_time(job.attempt_started_at)}"
    return line


def _spares(view: ClusterView) -> str:
    return f" ({view.spare_nodes} of them spare)" if view.spare_nodes else ""


def render(view: ClusterView) -> RenderableType:
    in_service = sum(1 for n in view.nodes if n.lifecycle == "InService")
    cost = "-" if view.cost_usd is None else format_usd(view.cost_usd)
    since = f" since {format_time(view.group_created_at)}" if view.group_created_at else ""
    header = Text.assemble(
        (view.stack_name, "bold"),
        f"   {in_service}/{view.node_count} x {view.instance_type} in service{_spares(view)}   as of "
        f"{format_time(view.collected_at)}\n",
        ("cost so far ", ""), (f"~{cost}", "bold"),
        f"{since} (nodes in service x {format_usd(view.usd_per_node_hour)}/h On-Demand: an estimate)",
    )
    parts: list[RenderableType] = [header, nodes_table(view), job_panel(view)]
    parts += [Text(note, style="yellow") for note in view.notes]
    return Group(*parts)
