"""The bootstrap log: /var/log/cluster/bootstrap.log (shipped to CloudWatch) and stdout (cloud-init's log)."""

from __future__ import annotations

import logging
import os
import sys
import time

from node_bootstrap.host import Host

LOG_FILE = "/var/log/cluster/bootstrap.log"
_FORMAT = "%(asctime)s %(levelname)s %(message)s"
_MARK = "_node_bootstrap_handler"


class _UtcFormatter(logging.Formatter):
    converter = time.gmtime

    def formatTime(self, record, datefmt=None):  # noqa: N802 (logging's API)
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", self.converter(record.created))


def setup_logging(host: Host, *, to_file: bool, verbose: bool = False) -> logging.Logger:
    """Log to stdout and, unless `to_file` is False (dry-run), append to the bootstrap log under the root."""
    logger = logging.getLogger("node_bootstrap")
    for handler in [h for h in logger.handlers if getattr(h, _MARK, False)]:
        logger.removeHandler(handler)
        handler.close()
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False
    handlers = [logging.StreamHandler(sys.stdout)]
    if to_file:
        path = host.path(LOG_FILE)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        handlers.append(logging.FileHandler(path, encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(_UtcFormatter(_FORMAT))
        setattr(handler, _MARK, True)
        logger.addHandler(handler)
    return logger
