"""ClusterDashboard: one CloudWatch dashboard per cluster, the graphs an operator opens first.

Per node (GPU utilization, memory, temperature, power, SM clock, EFA throughput, host CPU and memory, disk),
for the running job (tokens/s, MFU, loss, the held-out loss and perplexity, step time spread, straggler ratio),
for FSx for Lustre (throughput, free space) and the cluster's estimated cost. Nodes and jobs come and go, so
those graphs are SEARCH expressions over one exact dimension schema each, pinned to this cluster's Auto Scaling
group or stack name (cluster_spec/metrics.py names every metric and who produces it). Labels use the dimension
values (`${PROP('Dim.InstanceId')}`, CloudWatch dynamic labels).
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from constructs import Construct

from cluster_spec import metrics as cm
from instance_catalog.instance_types import InstanceType

NODE_LABEL = "${PROP('Dim.InstanceId')}"
JOB_LABEL = "${PROP('Dim.JobId')}"


class ClusterDashboard(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        dashboard_name: str,
        cluster_name: str,
        auto_scaling_group_name: str,
        file_system_id: str,
        instance_type: InstanceType,
        interval_seconds: int,
        log_group_name: str,
    ) -> None:
        super().__init__(scope, construct_id)
        self.cluster_name = cluster_name
        self.group = auto_scaling_group_name
        # a graph cannot be finer than the nodes sample; below a minute the agent's metrics are high-resolution
        self.period_s = max(60, interval_seconds)
        self.instance_type = instance_type
        self.dashboard = cloudwatch.Dashboard(
            self, "Dashboard", dashboard_name=dashboard_name, default_interval=Duration.hours(3)
        )
        self.dashboard_name = dashboard_name
        # CloudFormation takes Tags on AWS::CloudWatch::Dashboard (CloudFormation Template Reference,
        # AWS::CloudWatch::Dashboard) and the stack's tags reach it; cfn-lint 1.58's bundled schema predates
        # that property and reports it as E3002.
        self.dashboard.node.default_child.add_metadata("cfn-lint", {"config": {"ignore_checks": ["E3002"]}})
        self.dashboard.add_widgets(self._header(log_group_name))
        self.dashboard.add_widgets(
            self._node_graph("GPU utilization per node (mean of its GPUs, %)", cm.GPU_UTILIZATION, "Average",
                             width=12, y_max=100),
            self._node_graph("GPU memory used per node (mean per GPU, MiB)", cm.GPU_MEMORY_USED, "Average",
                             width=12),
        )
        self.dashboard.add_widgets(
            self._node_graph("GPU temperature per node (hottest GPU, C)", cm.GPU_TEMPERATURE, "Maximum"),
            self._node_graph("GPU power per node (mean per GPU, W)", cm.GPU_POWER, "Average"),
            self._node_graph("SM clock per node (slowest GPU, MHz): a low one is throttled", cm.GPU_SM_CLOCK,
                             "Minimum"),
        )
        self.dashboard.add_widgets(self._efa_throughput(), self._efa_errors())
        self.dashboard.add_widgets(
            self._job_graph("Tokens per second (job)", cm.TOKENS_PER_SECOND, "Average", width=6),
            self._job_graph("MFU (% of dense BF16 peak)", cm.MFU, "Average", width=6),
            self._job_graph("Loss", cm.LOSS, "Average", width=6),
            self._validation(),
        )
        self.dashboard.add_widgets(self._step_time_spread(), self._stragglers())
        self.dashboard.add_widgets(self._goodput(), self._goodput_note())
        self.dashboard.add_widgets(
            self._fsx_throughput(file_system_id), self._fsx_free(file_system_id), self._cost()
        )
        self.dashboard.add_widgets(self._host(), self._disks())

    @property
    def url(self) -> str:
        """The console link (region from the stack's environment)."""
        from aws_cdk import Stack

        region = Stack.of(self).region
        return (f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}"
                f"#dashboards/dashboard/{self.dashboard_name}")

    def add_alarms(self, alarms: Sequence[cloudwatch.IAlarm]) -> None:
        """A row with the state of every alarm of the cluster."""
        self.dashboard.add_widgets(
            cloudwatch.AlarmStatusWidget(title="Alarms", alarms=list(alarms), width=24, height=3)
        )

    # ----- widgets -----
    def _header(self, log_group_name: str) -> cloudwatch.TextWidget:
        price = self.instance_type.on_demand_usd_per_hour
        return cloudwatch.TextWidget(
            width=24,
            height=3,
            markdown=(
                f"# {self.cluster_name}: {self.instance_type.name} nodes, group `{self.group}`\n"
                f"Live view: `clusterctl top --stack {self.cluster_name}`. Logs: `{log_group_name}` "
                "(`<instance>/bootstrap`, `<instance>/efa-metrics`, `jobs/<job>/<instance>`). Cost is an "
                f"estimate: in-service nodes x ${price:,.2f}/h (the catalog's us-east-1 On-Demand price). "
                "What each graph means and what to do about it: docs/troubleshooting.md."
            ),
        )

    def _search(self, namespace: str, dims: tuple[str, ...], name: str, filters: dict[str, str],
                statistic: str, label: str, *, scale: str = "") -> cloudwatch.MathExpression:
        expression = cm.search(namespace, dims, name, filters, statistic, self.period_s) + scale
        return cloudwatch.MathExpression(expression=expression, label=label,
                                         period=Duration.seconds(self.period_s))

    def _node_graph(self, title: str, name: str, statistic: str, *, width: int = 8,
                    y_max: float | None = None) -> cloudwatch.GraphWidget:
        series = self._search(cm.AGENT_NAMESPACE, (cm.GROUP, cm.INSTANCE), name, {cm.GROUP: self.group},
                              statistic, NODE_LABEL)
        return cloudwatch.GraphWidget(
            title=title, left=[series], width=width, height=6,
            left_y_axis=cloudwatch.YAxisProps(min=0, max=y_max, show_units=False),
        )

    def _job_graph(self, title: str, name: str, statistic: str, *, width: int = 8) -> cloudwatch.GraphWidget:
        series = self._search(cm.TRAINING_NAMESPACE, (cm.CLUSTER, cm.JOB), name, {cm.CLUSTER: self.cluster_name},
                              statistic, JOB_LABEL)
        return cloudwatch.GraphWidget(title=title, left=[series], width=width, height=6,
                                      left_y_axis=cloudwatch.YAxisProps(show_units=False))

    def _validation(self) -> cloudwatch.GraphWidget:
        # one datapoint per evaluation ([validation] interval_steps), not one per logged step
        loss, perplexity = (
            self._search(cm.TRAINING_NAMESPACE, (cm.CLUSTER, cm.JOB), name, {cm.CLUSTER: self.cluster_name},
                         "Average", f"{JOB_LABEL} {what}")
            for name, what in ((cm.VALIDATION_LOSS, "held-out loss"), (cm.VALIDATION_PERPLEXITY, "perplexity (right)"))
        )
        return cloudwatch.GraphWidget(title="Validation loss (held-out) and perplexity", left=[loss],
                                      right=[perplexity], width=6, height=6,
                                      left_y_axis=cloudwatch.YAxisProps(show_units=False),
                                      right_y_axis=cloudwatch.YAxisProps(min=1, show_units=False))

    def _goodput(self) -> cloudwatch.GraphWidget:
        series = self._search(cm.TRAINING_NAMESPACE, (cm.CLUSTER, cm.JOB), cm.GOODPUT,
                              {cm.CLUSTER: self.cluster_name}, "Average", JOB_LABEL)
        return cloudwatch.GraphWidget(title="Goodput (% of the trainer process's time in counted steps)",
                                      left=[series], width=12, height=6,
                                      left_y_axis=cloudwatch.YAxisProps(min=0, max=100, show_units=False))

    def _goodput_note(self) -> cloudwatch.TextWidget:
        # the graph is what a trainer process knows; the job's whole time (waits for nodes, restarts, steps
        # re-run after a restore) is in its record, which clusterctl reads (docs/operations.md, "Goodput")
        return cloudwatch.TextWidget(width=12, height=6, markdown=(
            "## Goodput\nThe graph: each attempt's trainer, its step seconds over its process's wall time "
            "(start-up, checkpoint load, compile and validation are the rest); it starts low and climbs "
            "after each restart. The whole job since its submit, with the waits for nodes, the restarts and "
            "the steps re-run after a restore, split by cause: `clusterctl status JOB` (`--json`: every "
            "category in seconds). docs/operations.md, \"Goodput\"."))

    def _efa_throughput(self) -> cloudwatch.GraphWidget:
        # per-interval byte deltas: Sum over the period x 8 / 1e9 / period = Gbit/s
        scale = f" * 8 / 1000000000 / {self.period_s}"
        series = [
            self._search(cm.TRAINING_NAMESPACE, (cm.GROUP, cm.INSTANCE), name, {cm.GROUP: self.group}, "Sum",
                         f"{NODE_LABEL} {direction}", scale=scale)
            for name, direction in ((cm.EFA_TX_BYTES, "tx"), (cm.EFA_RX_BYTES, "rx"))
        ]
        return cloudwatch.GraphWidget(
            title="EFA throughput per node (Gbit/s, all EFA devices)", left=series, width=12, height=6,
            left_y_axis=cloudwatch.YAxisProps(min=0, show_units=False),
        )

    def _efa_errors(self) -> cloudwatch.GraphWidget:
        series = [
            self._search(cm.TRAINING_NAMESPACE, (cm.GROUP, cm.INSTANCE), name, {cm.GROUP: self.group}, "Sum",
                         f"{NODE_LABEL} {what}")
            for name, what in ((cm.EFA_ERROR_EVENTS, "error events"), (cm.EFA_RX_DROPS, "rx drops"),
                               (cm.EFA_RETRANSMITTED_PACKETS, "retransmitted packets"))
        ]
        return cloudwatch.GraphWidget(
            title="EFA errors per node (count per period: timeouts, unresponsive peers, RDMA errors)",
            left=series, width=12, height=6, left_y_axis=cloudwatch.YAxisProps(min=0, show_units=False),
        )

    def _step_time_spread(self) -> cloudwatch.GraphWidget:
        series = [
            self._search(cm.TRAINING_NAMESPACE, (cm.CLUSTER, cm.JOB), name, {cm.CLUSTER: self.cluster_name},
                         "Average", f"{JOB_LABEL} {what}")
            for name, what in ((cm.STEP_TIME_MAX, "slowest rank"), (cm.STEP_TIME_MEDIAN, "median rank"),
                               (cm.STEP_TIME_MIN, "fastest rank"))
        ]
        rank = self._search(cm.TRAINING_NAMESPACE, (cm.CLUSTER, cm.JOB), cm.SLOWEST_RANK,
                            {cm.CLUSTER: self.cluster_name}, "Maximum", f"{JOB_LABEL} slowest rank (right)")
        return cloudwatch.GraphWidget(title="Step time across ranks (s), and which rank is slowest",
                                      left=series, right=[rank], width=12, height=6,
                                      left_y_axis=cloudwatch.YAxisProps(min=0, show_units=False),
                                      right_y_axis=cloudwatch.YAxisProps(min=0, show_units=False))

    def _stragglers(self) -> cloudwatch.GraphWidget:
        ratio = self._search(cm.TRAINING_NAMESPACE, (cm.CLUSTER, cm.JOB), cm.STRAGGLER_RATIO,
                             {cm.CLUSTER: self.cluster_name}, "Maximum", f"{JOB_LABEL} slowest / median step time")
        gap = cloudwatch.MathExpression(
            expression="mean - lowest",
            using_metrics={"mean": self._cluster_gpu("Average"), "lowest": self._cluster_gpu("Minimum")},
            label="mean GPU utilization - lowest GPU's (points, right)",
            period=Duration.seconds(self.period_s),
        )
        return cloudwatch.GraphWidget(title="Stragglers: step time ratio (left), GPU utilization gap (right)",
                                      left=[ratio], right=[gap], width=12, height=6,
                                      left_y_axis=cloudwatch.YAxisProps(min=0, show_units=False),
                                      right_y_axis=cloudwatch.YAxisProps(min=0, max=100, show_units=False))

    def _cluster_gpu(self, statistic: str) -> cloudwatch.Metric:
        return cloudwatch.Metric(namespace=cm.AGENT_NAMESPACE, metric_name=cm.GPU_UTILIZATION,
                                 dimensions_map={cm.GROUP: self.group}, statistic=statistic,
                                 period=Duration.seconds(self.period_s))

    def _fsx_metric(self, file_system_id: str, name: str, statistic: str) -> cloudwatch.Metric:
        return cloudwatch.Metric(namespace=cm.FSX_NAMESPACE, metric_name=name,
                                 dimensions_map={"FileSystemId": file_system_id}, statistic=statistic,
                                 period=Duration.seconds(self.period_s))

    def _fsx_throughput(self, file_system_id: str) -> cloudwatch.GraphWidget:
        # FSx publishes bytes per minute; Sum / PERIOD = bytes/s (FSx for Lustre User Guide, "Metrics")
        series = [
            cloudwatch.MathExpression(expression=f"{key} / PERIOD({key}) / 1000000000",
                                      using_metrics={key: self._fsx_metric(file_system_id, name, "Sum")},
                                      label=label, period=Duration.seconds(self.period_s))
            for key, name, label in (("read", cm.FSX_READ_BYTES, "read GB/s"),
                                     ("written", cm.FSX_WRITE_BYTES, "write GB/s"))
        ]
        return cloudwatch.GraphWidget(title="FSx for Lustre throughput (GB/s)", left=series, width=8, height=6,
                                      left_y_axis=cloudwatch.YAxisProps(min=0, show_units=False))

    def _fsx_free(self, file_system_id: str) -> cloudwatch.GraphWidget:
        free = cloudwatch.MathExpression(
            expression="free / 1073741824",
            using_metrics={"free": self._fsx_metric(file_system_id, cm.FSX_FREE_STORAGE, "Minimum")},
            label="free GiB",
            period=Duration.seconds(self.period_s),
        )
        return cloudwatch.GraphWidget(title="FSx for Lustre free space (GiB)", left=[free], width=8, height=6,
                                      left_y_axis=cloudwatch.YAxisProps(min=0, show_units=False))

    def _cost(self) -> cloudwatch.GraphWidget:
        price = self.instance_type.on_demand_usd_per_hour
        nodes = cloudwatch.Metric(namespace=cm.AUTOSCALING_NAMESPACE, metric_name=cm.GROUP_IN_SERVICE,
                                  dimensions_map={cm.GROUP: self.group}, statistic="Average",
                                  period=Duration.seconds(self.period_s), label="nodes in service")
        cost = cloudwatch.MathExpression(
            expression=f"RUNNING_SUM(nodes * PERIOD(nodes) / 3600) * {price}",
            using_metrics={"nodes": nodes},
            label="estimated USD since the start of this graph",
            period=Duration.seconds(self.period_s),
        )
        return cloudwatch.GraphWidget(title="Cost so far (estimate) and nodes in service", left=[cost],
                                      right=[nodes], width=8, height=6,
                                      left_y_axis=cloudwatch.YAxisProps(min=0, show_units=False),
                                      right_y_axis=cloudwatch.YAxisProps(min=0, show_units=False))

    def _host(self) -> cloudwatch.GraphWidget:
        series = [
            self._search(cm.AGENT_NAMESPACE, (cm.GROUP, cm.INSTANCE), name, {cm.GROUP: self.group}, "Average",
                         f"{NODE_LABEL} {what}")
            for name, what in ((cm.CPU_ACTIVE, "CPU"), (cm.CPU_IOWAIT, "CPU iowait"),
                               (cm.MEM_USED_PERCENT, "memory"))
        ]
        return cloudwatch.GraphWidget(title="Host CPU and memory per node (%)", left=series, width=12, height=6,
                                      left_y_axis=cloudwatch.YAxisProps(min=0, max=100, show_units=False))

    def _disks(self) -> cloudwatch.GraphWidget:
        series = self._search(
            cm.AGENT_NAMESPACE, (cm.GROUP, cm.INSTANCE, "fstype", "path"), cm.DISK_USED_PERCENT,
            {cm.GROUP: self.group}, "Maximum", f"{NODE_LABEL} " + "${PROP('Dim.path')}",
        )
        return cloudwatch.GraphWidget(title="Disk used per node: /, scratch, /fsx (%)", left=[series], width=12,
                                      height=6, left_y_axis=cloudwatch.YAxisProps(min=0, max=100,
                                                                                  show_units=False))
