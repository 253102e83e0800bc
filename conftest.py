"""Root pytest configuration: what every test module needs before anything is imported."""

import os

# Same as the Makefile: silence jsii's Node 20 deprecation/end-of-life banners (pytest run directly too).
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
# Tests never reach AWS: no credential probing of the instance metadata service.
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")


def pytest_collection_modifyitems(config, items):
    """Files with slow tests (torchrun, drills, the CDK CLI) first. `make test` hands whole files to its
    workers in this order (pytest-xdist, --dist loadfile): the longest start first and the short ones fill
    in around them, instead of a long file starting last and leaving the other workers idle at the end.
    Within a file the order is unchanged; run serially, only the order of files changes."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: files stay whole and in order
