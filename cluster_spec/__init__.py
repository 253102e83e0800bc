"""cluster_spec: what a cluster is, shared by the stack, its constructs and clusterctl.

- settings.py: the typed settings, one frozen dataclass per concern, and the values each may take;
- context.py: load_settings, the one place CDK context is read and validated into them;
- values.py: the parsers and the one-line SettingsError behind every setting;
- metrics.py: the names of the metrics the nodes publish and the dashboard, alarms and `clusterctl top` read.

May import: instance_catalog. No CDK, no boto3: constructs, the stack and the CLI import it downward.
"""
