"""stacks: TrainingClusterStack, which wires the constructs from the typed settings, and what the stack applies
to the whole template (cdk-nag suppressions, checkov exceptions, each with its reason).

The top floor with app.py: may import cluster_constructs, cluster_spec and instance_catalog.
"""
