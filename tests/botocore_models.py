"""One parsed copy of each botocore data file per test process.

Every test builds fresh boto3 sessions (moto's isolation, clusterctl's and the keeper's own contexts), and every
botocore session parses the service models' JSON again: EC2's model alone is megabytes, and the parsing was about
half of the clusterctl tests' CPU. Botocore already shares one parsed model among the clients of a session (its
loader caches per instance); this shares it among sessions too. The models are data botocore reads, never writes,
except the SDK extras it merges into a service model on loading it, a merge that changes nothing the second time."""

from __future__ import annotations

import functools
from typing import Any

from botocore.loaders import Loader

_PARSED: dict[tuple[tuple[str, ...], str], Any] = {}


def share_parsed_models() -> None:
    """Loader.load_data_with_path, cached by (search paths, name) for every loader of this process."""
    if getattr(Loader.load_data_with_path, "shared_across_sessions", False):
        return
    load = Loader.load_data_with_path

    @functools.wraps(load)
    def load_data_with_path(self: Loader, name: str) -> Any:
        key = (tuple(self.search_paths), name)
        if key not in _PARSED:
            _PARSED[key] = load(self, name)
        return _PARSED[key]

    load_data_with_path.shared_across_sessions = True  # type: ignore[attr-defined]
    Loader.load_data_with_path = load_data_with_path  # type: ignore[method-assign]
