"""Root-relative access to the node's files, so every step runs unchanged against a fake root in tests.

Two kinds of path meet here. A *node path* ("/etc/fstab", "/scratch") is what the node will see after reboot:
it is what goes into fstab, env files and logs. A *host path* (`host.path("/scratch")`) is where that file is
on the machine running the code: the same string when the root is "/", a path under the fake root in tests.
Commands and the kernel (/proc/mounts) see host paths; files that persist for the next boot carry node paths.
"""

from __future__ import annotations

import logging
import os
import shutil

LOG = logging.getLogger("node_bootstrap")


class Host:
    """The node's filesystem under `root`. Writes go through here so they are recorded and dry-run safe."""

    def __init__(self, root: str = "/", *, dry_run: bool = False, print_fn=print) -> None:
        self.root = os.path.abspath(root)
        self.dry_run = dry_run
        self.changes: list[str] = []  # every file-system change made (or, in dry-run, printed), in order
        self._print = print_fn

    def path(self, node_path: str) -> str:
        """The host path of an absolute node path."""
        if not node_path.startswith("/"):
            raise ValueError(f"node paths are absolute, got {node_path!r}")
        if self.root == "/":
            return node_path
        return os.path.join(self.root, node_path.lstrip("/"))

    def node_path(self, host_path: str) -> str:
        """The node path of a host path under the root (the inverse of `path`)."""
        if self.root == "/":
            return host_path
        rel = os.path.relpath(host_path, self.root)
        if rel.startswith(".."):
            return host_path  # outside the fake root (a real /dev/loopN in the loop-device test)
        return "/" + rel if rel != "." else "/"

    def exists(self, node_path: str) -> bool:
        return os.path.lexists(self.path(node_path))

    def read_text(self, node_path: str, default: str | None = None) -> str:
        """The file's text; `default` when it does not exist (FileNotFoundError when no default is given)."""
        try:
            with open(self.path(node_path), encoding="utf-8") as f:
                return f.read()
        except FileNotFoundError:
            if default is None:
                raise
            return default

    def write_text(self, node_path: str, text: str, *, mode: int = 0o644) -> bool:
        """Write the file when its content differs; True when it changed (or would change, in dry-run)."""
        if self.read_text(node_path, default="\0missing") == text:
            return False
        self._record(f"write {node_path}")
        if self.dry_run:
            return True
        target = self.path(node_path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        tmp = target + ".tmp-node-bootstrap"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)  # atomic: a crash never leaves a half-written fstab
        return True

    def makedirs(self, node_path: str) -> bool:
        if os.path.isdir(self.path(node_path)):
            return False
        self._record(f"mkdir {node_path}")
        if not self.dry_run:
            os.makedirs(self.path(node_path), exist_ok=True)
        return True

    def symlink(self, target_node_path: str, link_node_path: str) -> bool:
        """Point `link_node_path` at `target_node_path` (a node path: the link must work after boot)."""
        link = self.path(link_node_path)
        if os.path.islink(link) and os.readlink(link) == target_node_path:
            return False
        self._record(f"symlink {link_node_path} -> {target_node_path}")
        if not self.dry_run:
            os.makedirs(os.path.dirname(link), exist_ok=True)
            if os.path.isdir(link) and not os.path.islink(link):
                os.rmdir(link)  # only an empty directory: callers refuse non-empty ones first
            os.symlink(target_node_path, link)
        return True

    def remove(self, node_path: str) -> None:
        self._record(f"remove {node_path}")
        if not self.dry_run:
            os.remove(self.path(node_path))

    def remove_tree(self, node_path: str) -> bool:
        """Remove a directory and all it holds (only ever one node_bootstrap created); False when absent."""
        path = self.path(node_path)
        if not os.path.lexists(path):
            return False
        self._record(f"remove {node_path}")
        if not self.dry_run:
            shutil.rmtree(path)
        return True

    def rename(self, node_path: str, new_node_path: str) -> None:
        """Rename within one file system: atomic, so `new_node_path` never holds a partial copy."""
        self._record(f"rename {node_path} -> {new_node_path}")
        if not self.dry_run:
            os.rename(self.path(node_path), self.path(new_node_path))

    def _record(self, change: str) -> None:
        self.changes.append(change)
        if self.dry_run:
            self._print(f"  would {change}")
        else:
            LOG.info("%s", change)
