"""The bootstrap log: /var/log/cluster/bootstrap.log (shipped to CloudWatch) and stdout (cloud-init's log);
the node health monitor's: /var/log/cluster/health-monitor.log (shipped too) and stdout (the journal)."""

from __future__ import annotations

import logging
import os
import sys
import time

from node_bootstrap.host import Host

LOG_FILE = "/var/log/cluster/bootstrap.log"
MONITOR_LOG_FILE = "/var/log/cluster/health-monitor.log"
_FORMAT = "%(asctime)s %(levelname)s %(message)s"
_MARK = "_node_bootstrap_handler"


class _UtcFormatter(logging.Formatter):
    converter = time.gmtime

    def formatTime(self, record, datefmt=None):  # noqa: N802 (logging's API)
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", self.converter(record.created))


def setup_logging(host: Host, *, to_file: bool, verbose: bool = False, log_file: str = LOG_FILE,
                  to_stdout: bool = True) -> logging.Logger:
    """Log to stdout (unless `to_stdout` is False: output that must stay JSON) and, unless `to_file` is False
    (dry-run), append to `log_file` under the root."""
    logger = logging.getLogger("node_bootstrap")
    for handler in [h for h in logger.handlers if getattr(h, _MARK, False)]:
        logger.removeHandler(handler)
        handler.close()
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stdout)] if to_stdout else []
    if to_file:
        path = host.path(log_file)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        handlers.append(logging.FileHandler(path, encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(_UtcFormatter(_FORMAT))
        setattr(handler, _MARK, True)
        logger.addHandler(handler)
    return logger
