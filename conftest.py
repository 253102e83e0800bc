"""Root pytest configuration: what every test module needs before anything is imported."""

import os

# Same as the Makefile: silence jsii's Node 20 deprecation/end-of-life banners (pytest run directly too).
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
# Tests never reach AWS: no credential probing of the instance metadata service.
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")


def pytest_collection_modifyitems(config, items):
    """The order of files for `make test`'s workers (pytest-xdist, --dist loadfile, which hands whole files to
    the workers in this order):

    - the files with slow tests (torchrun, drills, the CDK CLI: several busy processes each) first, so that the
      longest start first and the short ones fill in around them, instead of a long file starting last and
      leaving the other workers idle at the end;
    - between them, the files that mostly wait on real timeouts (marked `waits`): beside a slow file their
      waiting leaves no core idle, while two of them side by side at the end left a core idle for ~90 s;
    - then the rest.

    Within a file the order is unchanged; run serially, only the order of files changes."""
    def files_marked(name: str) -> list:
        return list(dict.fromkeys(item.path for item in items if item.get_closest_marker(name)))

    slow = files_marked("slow")
    waiting = [path for path in files_marked("waits") if path not in slow]
    front = [path for pair in zip(slow, waiting, strict=False) for path in pair]
    front += slow[len(waiting):] + waiting[len(slow):]
    rank = {path: n for n, path in enumerate(front)}
    items.sort(key=lambda item: rank.get(item.path, len(front)))  # stable: files stay whole
